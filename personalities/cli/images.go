package cli

import (
	"cmp"
	"context"
	"fmt"
	"strings"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/printable"
)

// ForkCmd is `capsem fork VM NAME [--description TEXT]`.
type ForkCmd struct {
	VM          string `arg:"" help:"The VM to fork (id or name), running or stopped."`
	Name        string `arg:"" help:"The image's name (no VM or image may have it)."`
	Description string `name:"description" short:"d" help:"What the image is for."`
	Memory      bool   `help:"Also keep the VM's memory and CPU state (running or suspended VM): its VMs resume with its processes running."`
	JSON        bool   `help:"Print the image as JSON."`
}

// Run makes the image and describes it.
func (c *ForkCmd) Run(ctx context.Context) error {
	cl, err := client()
	if err != nil {
		return err
	}
	img, err := cl.Fork(ctx, c.VM, api.ForkRequest{Name: c.Name, Description: c.Description, Memory: c.Memory})
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(img)
	}
	fmt.Printf("image %s: %s in %d ms (capsem create --image %s)\n", printable.Line(img.Name), size(img.SizeBytes), img.ForkMS, printable.Line(img.Name))
	return nil
}

// ImageLsCmd is `capsem image ls`.
type ImageLsCmd struct {
	JSON bool `help:"Print the images as JSON."`
}

// Run lists the images.
func (c *ImageLsCmd) Run(ctx context.Context) error {
	cl, err := client()
	if err != nil {
		return err
	}
	imgs, err := cl.Images(ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(imgs)
	}
	var rows [][]string
	for _, img := range imgs {
		status := "ok"
		if img.Problem != "" {
			status = "unusable"
		}
		rows = append(rows, []string{printable.Line(img.Name), printable.Line(cmp.Or(img.Source.Name, img.Source.ID)), img.Base,
			size(img.SizeBytes), fmt.Sprint(len(img.UsedBy)), status, age(img.CreatedAt)})
	}
	table([]string{"NAME", "FROM", "BASE", "SIZE", "VMS", "STATUS", "AGE"}, rows)
	return nil
}

// ImageInfoCmd is `capsem image info NAME`.
type ImageInfoCmd struct {
	Name string `arg:"" help:"The image's name."`
	JSON bool   `help:"Print the image as JSON."`
}

// Run describes the image.
func (c *ImageInfoCmd) Run(ctx context.Context) error {
	cl, err := client()
	if err != nil {
		return err
	}
	img, err := cl.Image(ctx, c.Name)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(img)
	}
	rows := [][2]string{{"name", img.Name}, {"description", orDash(img.Description)},
		{"from", fmt.Sprintf("%s (%s, %s)", cmp.Or(img.Source.Name, img.Source.ID), img.Source.ID, img.Source.State)},
		{"created", img.CreatedAt.Local().Format("2006-01-02 15:04:05")}, {"base", img.Base}, {"root image", orDash(img.RootImage)},
		{"memory", fmt.Sprintf("%d MB", img.Config.RAMMB)}, {"cpus", fmt.Sprint(img.Config.CPUs)},
		{"disk", fmt.Sprintf("%s (%s allocated)", size(img.DiskBytes), size(img.DiskAllocated))},
		{"workspace", size(img.WorkspaceBytes)}, {"memory state", orDash(map[bool]string{true: size(img.StateBytes)}[img.Memory])}, {"size", size(img.SizeBytes)},
		{"fork", fmt.Sprintf("%d ms (paused %d ms)", img.ForkMS, img.PausedMS)},
		{"used by", orDash(strings.Join(img.UsedBy, ", "))}, {"problem", orDash(img.Problem)}}
	for _, r := range rows {
		fmt.Printf("%-12s %s\n", r[0]+":", printable.Line(r[1]))
	}
	return nil
}

// ImageRmCmd is `capsem image rm NAME...`.
type ImageRmCmd struct {
	Names []string `arg:"" help:"The images to delete (refused for one VMs were made from)."`
}

// Run deletes each image, going on past a refusal, and fails if any was.
func (c *ImageRmCmd) Run(ctx context.Context) error {
	cl, err := client()
	if err != nil {
		return err
	}
	var failed []string
	for _, name := range c.Names {
		if err := cl.DeleteImage(ctx, name); err != nil {
			fmt.Printf("%s: %v\n", printable.Line(name), err)
			failed = append(failed, name)
			continue
		}
		fmt.Printf("deleted image %s\n", printable.Line(name))
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d images not deleted", len(failed), len(c.Names))
	}
	return nil
}

// size is n bytes for people.
func size(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
