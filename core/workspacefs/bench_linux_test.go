package workspacefs

import (
	"strconv"
	"testing"

	"github.com/hugelgupf/p9/p9"
)

func BenchmarkWrite256K(b *testing.B) {
	fs, _ := testFS(b, Limits{Bytes: 1 << 40})
	_, r := attach(b, fs)
	f := create(b, r, "bench")
	buf := make([]byte, 256<<10)
	b.SetBytes(int64(len(buf)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// Wrap within 64 MiB so the benchmark measures writes, not the disk.
		if _, err := writeAll(f, buf, int64(i%256)*int64(len(buf))); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCreateSmallFiles(b *testing.B) {
	fs, _ := testFS(b, Limits{Bytes: 1 << 40, Inodes: 1 << 30})
	_, r := attach(b, fs)
	data := make([]byte, 1024)
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d := walk(b, r)
		f, _, _, err := d.Create("f"+strconv.Itoa(i), p9.WriteOnly, 0o644, p9.NoUID, p9.NoGID)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := f.WriteAt(data, 0); err != nil {
			b.Fatal(err)
		}
		f.Close()
		d.Close()
	}
}
