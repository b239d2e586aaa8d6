package main

import (
	"fmt"
	"image/color"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
)

// ingestTargets are issue 13's goals for the sustained proxy/direct
// ratio, by batch size.
var ingestTargets = map[int]float64{1: 0.8, 10: 1.0, 100: 1.5, 1000: 1.5}

// writeIngestPNG draws the sustained proxy/direct ratio of each case as a
// bar chart grouped by batch size, one bar per client count, with the
// parity line and issue 13's targets, into path (PNG).
func writeIngestPNG(path, title string, ratios map[ingestCase]float64) error {
	var batches, clients []int
	for c := range ratios {
		if !slices.Contains(batches, c.batch) {
			batches = append(batches, c.batch)
		}
		if !slices.Contains(clients, c.conc) {
			clients = append(clients, c.conc)
		}
	}
	slices.Sort(batches)
	slices.Sort(clients)
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = "proxy sustained / direct events/s"
	p.X.Label.Text = "events per insert call (batch)"
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	width := vg.Points(min(36, 160/float64(len(clients))))
	for j, cl := range clients {
		vals := make(plotter.Values, len(batches))
		for i, b := range batches {
			vals[i] = ratios[ingestCase{b, cl}] // 0: not measured
		}
		bars, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return err
		}
		bars.Color = plotutil.Color(j)
		bars.LineStyle.Width = 0
		bars.Offset = vg.Length(float64(j)-float64(len(clients)-1)/2) * width
		p.Add(bars)
		p.Legend.Add(fmt.Sprintf("%d client(s)", cl), bars)
		p.Y.Max = max(p.Y.Max, slices.Max(vals))
		// the value above each bar
		lx := plotter.XYLabels{XYs: make(plotter.XYs, len(batches)), Labels: make([]string, len(batches))}
		for i, v := range vals {
			lx.XYs[i] = plotter.XY{X: float64(i), Y: v}
			if v > 0 {
				lx.Labels[i] = fmt.Sprintf("%.2f", v)
			}
		}
		labels, err := plotter.NewLabels(lx)
		if err != nil {
			return err
		}
		for i := range labels.TextStyle {
			labels.TextStyle[i].XAlign = text.XCenter
			labels.TextStyle[i].Font.Size = vg.Points(9)
		}
		labels.Offset = vg.Point{X: bars.Offset, Y: vg.Points(2)}
		p.Add(labels)
	}
	parity, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: 1}, {X: float64(len(batches)) - 0.5, Y: 1}})
	if err != nil {
		return err
	}
	parity.Color = color.Gray{Y: 80}
	p.Add(parity)
	p.Legend.Add("parity (1.0)", parity)
	var target *plotter.Line
	for i, b := range batches {
		t, ok := ingestTargets[b]
		if !ok {
			continue
		}
		l, err := plotter.NewLine(plotter.XYs{{X: float64(i) - 0.45, Y: t}, {X: float64(i) + 0.45, Y: t}})
		if err != nil {
			return err
		}
		l.Color = color.RGBA{R: 200, A: 255}
		l.Width = vg.Points(1.5)
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
		p.Y.Max = max(p.Y.Max, t)
		target = l
	}
	if target != nil {
		p.Legend.Add("issue 13 target", target)
	}
	p.Y.Max *= 1.4 // room for the legend above the bars
	p.Legend.Top = true
	labels := make([]string, len(batches))
	for i, b := range batches {
		labels[i] = fmt.Sprint(b)
	}
	p.NominalX(labels...)
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}
