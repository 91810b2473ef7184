package bench

import (
	"fmt"
	"image/color"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// writePlots writes throughput-<run>-r<round>.png into dir for each
// scenario run: unique events applied and records committed per second
// over time (one-second windows), the membership changes marked.
func (res *Results) writePlots(dir string) ([]string, error) {
	var files []string
	for i := range res.Runs {
		r := &res.Runs[i]
		if len(r.Series) < 2 {
			continue
		}
		f := fmt.Sprintf("throughput-%s-r%d.png", r.Name, r.Round)
		if err := plotRun(filepath.Join(dir, f), r, len(res.Settings.Handlers)); err != nil {
			return files, fmt.Errorf("plot %s: %w", f, err)
		}
		files = append(files, f)
	}
	return files, nil
}

func plotRun(path string, r *RunResult, handlers int) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("onceflow bench %s (round %d): throughput over time", r.Name, r.Round)
	p.X.Label.Text = "seconds"
	p.Y.Label.Text = "per second (1 s windows)"
	pts, events := plotter.XYs{}, plotter.XYs{}
	maxY := 1.0
	const window = 4 // samples are 250 ms apart
	for i := 1; i < len(r.Series); i++ {
		j := max(0, i-window)
		// A replay's second group starts again from 0: windows do not
		// reach back across the restart.
		for k := i; k > j; k-- {
			if r.Series[k].Committed < r.Series[k-1].Committed {
				j = k
				break
			}
		}
		dt := r.Series[i].Seconds - r.Series[j].Seconds
		if dt <= 0 {
			continue
		}
		y := float64(r.Series[i].Committed-r.Series[j].Committed) / dt
		e := float64(r.Series[i].Applied-r.Series[j].Applied) / float64(max(handlers, 1)) / dt
		pts = append(pts, plotter.XY{X: r.Series[i].Seconds, Y: y})
		events = append(events, plotter.XY{X: r.Series[i].Seconds, Y: e})
		maxY = max(maxY, y, e)
	}
	l, err := plotter.NewLine(pts)
	if err != nil {
		return err
	}
	l.Color, l.Width = color.RGBA{R: 0xaa, G: 0xaa, B: 0xaa, A: 255}, vg.Points(1)
	le, err := plotter.NewLine(events)
	if err != nil {
		return err
	}
	le.Color, le.Width = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 255}, vg.Points(1.5)
	p.Add(l, le)
	p.Legend.Add("unique events applied/s", le)
	p.Legend.Add("records committed/s", l)
	p.Legend.Top, p.Legend.Left = true, true
	colors := map[string]color.RGBA{"join": {R: 0x2c, G: 0xa0, B: 0x2c, A: 255}, "leave": {R: 0xff, G: 0x99, A: 255},
		"kill": {R: 0xd6, G: 0x27, B: 0x28, A: 255}, "restart": {R: 0x8c, G: 0x56, B: 0x4b, A: 255}, "reread": {R: 0x94, G: 0x67, B: 0xbd, A: 255}}
	seen := map[string]bool{}
	for _, c := range r.Changes {
		m, err := plotter.NewLine(plotter.XYs{{X: c.Seconds, Y: 0}, {X: c.Seconds, Y: maxY}})
		if err != nil {
			return err
		}
		m.Color = colors[c.What]
		m.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
		p.Add(m)
		if !seen[c.What] {
			seen[c.What] = true
			p.Legend.Add(c.What, m)
		}
	}
	p.Y.Min = 0
	return p.Save(9*vg.Inch, 4*vg.Inch, path)
}
