package api

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
)

// A file read streams as the raw body of GET files/content, from the guest
// through the per-VM process and the service to the client, no end holding
// more than a copy buffer of it. Its status is sent with the first byte, so
// a failure after that (the guest died, the file shrank) is reported in
// the TrailerError trailer, and the client checks it. Both the per-VM
// process and the service answer with FileStream; clients read with
// ReadFileStream.

// FileStream answers one streamed file read.
type FileStream struct {
	w       http.ResponseWriter
	hash    hash.Hash
	n       int64
	started bool
}

// NewFileStream starts nothing yet: the status goes with the first byte,
// so a refusal before it still gets its own status (Fail).
func NewFileStream(w http.ResponseWriter) *FileStream {
	return &FileStream{w: w, hash: sha256.New()}
}

func (f *FileStream) start() {
	if f.started {
		return
	}
	f.started = true
	h := f.w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Trailer", TrailerError+", "+TrailerErrorCode+", "+TrailerDigest)
	f.w.WriteHeader(http.StatusOK)
}

// Write sends file bytes.
func (f *FileStream) Write(p []byte) (int, error) {
	f.start()
	n, err := f.w.Write(p)
	f.hash.Write(p[:n])
	f.n += int64(n)
	return n, err
}

// Bytes is how many bytes have been sent.
func (f *FileStream) Bytes() int64 { return f.n }

// Digest is the SHA-256 (hex) of the bytes sent so far.
func (f *FileStream) Digest() string { return hex.EncodeToString(f.hash.Sum(nil)) }

// Fail ends the read with err: as an Error body with status and code when
// no byte has gone yet, else in the error trailers.
func (f *FileStream) Fail(status int, code string, err error) {
	if f.started {
		f.w.Header().Set(TrailerError, err.Error())
		f.w.Header().Set(TrailerErrorCode, code)
		return
	}
	f.w.Header().Set("Content-Type", "application/json")
	f.w.WriteHeader(status)
	json.NewEncoder(f.w).Encode(Error{Error: err.Error(), Code: code})
}

// Finish ends a whole file (an empty one too) with its digest.
func (f *FileStream) Finish() {
	f.start()
	f.w.Header().Set(TrailerDigest, f.Digest())
}

// ErrFileCut is returned (wrapped) by ReadFileStream for a read that did not
// end whole: bytes already copied to the writer are not the file.
var ErrFileCut = errors.New("the file did not arrive whole")

// ReadFileStream copies a streamed file read's body (a 200 response) to w,
// and checks that it ended whole: no error trailer, and the sender's digest
// equal to the digest of what arrived. It returns the byte count and the
// digest.
func ReadFileStream(resp *http.Response, w io.Writer) (int64, string, error) {
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(w, h), resp.Body)
	if err != nil {
		return n, "", fmt.Errorf("%w: after %d bytes: %w", ErrFileCut, n, err)
	}
	if msg := resp.Trailer.Get(TrailerError); msg != "" {
		return n, "", fmt.Errorf("%w: after %d bytes: %s", ErrFileCut, n, msg)
	}
	digest := hex.EncodeToString(h.Sum(nil))
	if sent := resp.Trailer.Get(TrailerDigest); sent != digest {
		if sent == "" {
			return n, "", fmt.Errorf("%w: after %d bytes the stream ended without its digest", ErrFileCut, n)
		}
		return n, "", fmt.Errorf("%w: %d bytes with SHA-256 %s, the sender sent %s", ErrFileCut, n, digest, sent)
	}
	return n, digest, nil
}
