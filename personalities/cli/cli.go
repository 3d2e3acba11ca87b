// Package cli holds the CLI verbs a person drives sandboxes with (capsem
// create, exec, ls, info, stop, resume, persist, rm, purge, logs, inspect,
// cp), one file per verb. Every verb goes through the capsem service,
// which the first one starts when none answers.
package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/apiclient"
	"github.com/capsem/capsem/core/printable"
	"github.com/capsem/capsem/core/service"
)

// client is the service's client, starting a service when none answers.
func client() (*apiclient.ServiceClient, error) { return service.Ensuring("", nil) }

// printJSON prints v as indented JSON, every character a terminal would
// act on escaped.
func printJSON(v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(append(printable.JSON(b), '\n'))
	return err
}

// table prints rows under a header, aligned; the caller escapes the cells
// (printable.Line), which must not hold a tab or a newline.
func table(header []string, rows [][]string) {
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(w, strings.Join(r, "\t"))
	}
	w.Flush()
}

// envMap parses K=V pairs.
func envMap(kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	env := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--env %q: want KEY=VALUE", kv)
		}
		env[k] = v
	}
	return env, nil
}

// portList is ports as "127.0.0.1:8080 -> 3000, ...".
func portList(ports []api.PortMapping) string {
	var parts []string
	for _, m := range ports {
		parts = append(parts, fmt.Sprintf("%s -> %d", m.Listen(), m.Guest))
	}
	return strings.Join(parts, ", ")
}

// age is a short "how long ago".
func age(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := time.Since(t).Round(time.Second)
	switch {
	case d < time.Minute:
		return d.String()
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printVM prints one VM as "key: value" lines. The values are escaped:
// the last log holds what the guest made the VM's process write.
func printVM(v api.VM) {
	rows := [][2]string{{"id", v.ID}, {"name", orDash(v.Name)}, {"state", string(v.State)}, {"persistent", fmt.Sprint(v.Persistent)}, {"run", fmt.Sprint(v.Run)},
		{"memory", fmt.Sprintf("%d MB", v.RAMMB)}, {"cpus", fmt.Sprint(v.CPUs)}, {"image", v.Image}, {"base", orDash(v.Base)}, {"workspace", orDash(v.Workspace)},
		{"created", v.CreatedAt.Local().Format(time.DateTime)}, {"session", v.SessionDir}}
	if v.PID > 0 {
		rows = append(rows, [2]string{"pid", fmt.Sprint(v.PID)})
	}
	if v.Process != nil {
		rows = append(rows, [2]string{"accelerator", v.Process.Accel + " (" + v.Process.AccelReason + ")"},
			[2]string{"boot", fmt.Sprintf("%s, %d ms", v.Process.Start, v.Process.BootTimings["total"])})
		if v.Process.StateReason != "" {
			rows = append(rows, [2]string{"why", v.Process.StateReason})
		}
		if w := v.Process.Workspace; w != nil {
			rows = append(rows, [2]string{"workspace", fmt.Sprintf("%s of %s, %d of %d files",
				humanBytes(w.UsedBytes), humanBytes(w.LimitBytes), w.Files, w.FilesLimit)})
		}
		if n := v.Process.Network; n != nil {
			rows = append(rows, [2]string{"network", fmt.Sprintf("%d connections open (most at once %d, bound %d), %d refused at the bound, %d DNS queries dropped",
				n.OpenConnections, n.PeakConnections, n.ConnectionLimit, n.RefusedAtLimit, n.QueriesDropped)})
		}
	}
	// A running VM's own list has the ports port-forward added.
	ports := v.Ports
	if v.Process != nil {
		ports = v.Process.Ports
	}
	if len(ports) > 0 {
		rows = append(rows, [2]string{"ports", portList(ports)})
	}
	if v.LastLog != "" {
		rows = append(rows, [2]string{"last log", "\n" + v.LastLog})
	}
	for _, r := range rows {
		fmt.Printf("%-12s %s\n", r[0]+":", printable.Text(r[1]))
	}
}

// humanBytes writes n in the largest binary unit that keeps it at least 1,
// with one decimal.
func humanBytes(n int64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	f, i := float64(n)/1024, 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	return fmt.Sprintf("%.1f %ciB", f, units[i])
}
