package netpolicy

// Verdict is one decision of the policy, with what decided it.
type Verdict struct {
	Allowed bool
	// Rule is the entry that decided: a configured pattern ("*.github.com"),
	// or a key ("net.default", "net.ports", "private-address").
	Rule string
	// Source is the file the rule came from; "" for a built-in default.
	Source string
	// Reason says why a request was refused, for messages and the ledger.
	Reason string
}
