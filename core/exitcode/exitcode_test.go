package exitcode

import (
	"errors"
	"fmt"
	"testing"
)

func TestOf(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
		ok   bool
	}{
		{Error{Code: 3}, 3, true},
		{fmt.Errorf("run: %w", Error{Code: 124}), 124, true},
		{errors.New("exit status 3"), 0, false},
		{nil, 0, false},
	} {
		code, ok := Of(tc.err)
		if code != tc.code || ok != tc.ok {
			t.Errorf("Of(%v) = %d, %v; want %d, %v", tc.err, code, ok, tc.code, tc.ok)
		}
	}
}
