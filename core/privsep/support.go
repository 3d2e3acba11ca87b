package privsep

// Support is what this kernel gives a privilege-separated child, probed
// without restricting the caller: each Err says why a part is missing.
type Support struct {
	LandlockABI   int // 0 when unavailable
	LandlockErr   error
	SeccompFilter bool
	SeccompErr    error
	NoNewPrivs    bool
	NoNewPrivsErr error
	Pdeathsig     bool
	PdeathsigErr  error
	// ScopesSignals: Landlock ABI 6 scopes signals and abstract Unix
	// sockets, which no filesystem rule covers.
	ScopesSignals bool
}
