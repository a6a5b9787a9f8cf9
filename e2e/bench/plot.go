package bench

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Timeline is one variant's run through a handover and a crash, for the
// picture: lanes top to bottom ("lock", then one per allocation), spans of
// time on them, and marks for the moments the bench acted.
type Timeline struct {
	Title   string // the variant
	Caption string // the measured gaps, shown under the title
	Lanes   []string
	Spans   []Span
	Marks   []Mark
	// End is the last moment observed, seconds from the origin.
	End float64
}

// SpanKind says what a span shows.
type SpanKind int

// Span kinds.
const (
	// Running: the allocation's workload process was alive.
	Running SpanKind = iota
	// Waiting: the allocation's supervisor ran, waiting for the lock.
	Waiting
	// Held: the lock was held by this allocation, whose supervisor was alive.
	Held
	// HeldDead: the lock was still held for an allocation whose supervisor
	// had been killed: the server had not expired it yet.
	HeldDead
)

// Span is a stretch of one lane, in seconds from the timeline's origin.
type Span struct {
	Lane     int
	From, To float64
	Kind     SpanKind
	// Color indexes palette: the allocation, so the lock lane shows whose
	// lock it was in that allocation's color.
	Color int
}

// Mark is a moment the bench acted (a stop, a SIGKILL).
type Mark struct {
	At    float64
	Label string
}

var palette = []color.RGBA{
	{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, // blue
	{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}, // orange
	{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, // green
	{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}, // purple
	{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff}, // brown
	{R: 0xe3, G: 0x77, B: 0xc2, A: 0xff}, // pink
}

var (
	gray      = color.RGBA{R: 0x99, G: 0x99, B: 0x99, A: 0xff}
	lightGray = color.RGBA{R: 0xd0, G: 0xd0, B: 0xd0, A: 0xff}
	markColor = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
)

func colorOf(i int) color.RGBA {
	if i < 0 {
		return gray
	}
	return palette[i%len(palette)]
}

// faded mixes c with white: a lock held for a dead holder.
func faded(c color.RGBA) color.RGBA {
	mix := func(v uint8) uint8 { return uint8((int(v) + 2*255) / 3) }
	return color.RGBA{R: mix(c.R), G: mix(c.G), B: mix(c.B), A: 0xff}
}

// timelinePlotter draws a Timeline's spans and marks on a plot whose Y axis
// is nominal (lane i at y = len(Lanes)-1-i, so lane 0 is on top).
type timelinePlotter struct{ tl Timeline }

func (tp timelinePlotter) DataRange() (xmin, xmax, ymin, ymax float64) {
	return 0, tp.tl.End, -0.5, float64(len(tp.tl.Lanes)) - 0.5
}

func (tp timelinePlotter) Plot(c draw.Canvas, plt *plot.Plot) {
	trX, trY := plt.Transforms(&c)
	n := len(tp.tl.Lanes)
	rect := func(x0, x1, yc, h float64, fill color.Color, outline *draw.LineStyle) {
		pts := []vg.Point{
			{X: trX(x0), Y: trY(yc - h/2)}, {X: trX(x1), Y: trY(yc - h/2)},
			{X: trX(x1), Y: trY(yc + h/2)}, {X: trX(x0), Y: trY(yc + h/2)},
		}
		c.FillPolygon(fill, c.ClipPolygonXY(pts))
		if outline != nil {
			c.StrokeLines(*outline, c.ClipLinesXY(append(pts, pts[0]))...)
		}
	}
	for _, s := range tp.tl.Spans {
		y := float64(n - 1 - s.Lane)
		col := colorOf(s.Color)
		to := math.Max(s.To, s.From+0.05) // keep instants visible
		switch s.Kind {
		case Running:
			rect(s.From, to, y, 0.55, col, nil)
		case Waiting:
			rect(s.From, to, y, 0.16, lightGray, nil)
		case Held:
			rect(s.From, to, y, 0.55, col, nil)
		case HeldDead:
			rect(s.From, to, y, 0.55, faded(col), &draw.LineStyle{Color: col, Width: vg.Points(1), Dashes: []vg.Length{vg.Points(3), vg.Points(2)}})
		}
	}
	style := draw.LineStyle{Color: markColor, Width: vg.Points(1.2), Dashes: []vg.Length{vg.Points(4), vg.Points(3)}}
	label := plt.X.Label.TextStyle
	label.Color = markColor
	label.Font.Size = vg.Points(9)
	label.XAlign = draw.XLeft
	label.YAlign = draw.YTop
	for i, m := range tp.tl.Marks {
		x := trX(m.At)
		c.StrokeLine2(style, x, c.Min.Y, x, c.Max.Y)
		// One line lower per mark, so that close marks' labels do not collide.
		y := c.Max.Y - vg.Points(2) - vg.Length(i)*label.Height(m.Label)
		c.FillText(label, vg.Point{X: x + vg.Points(3), Y: y}, m.Label)
	}
}

// secondTicks labels every 5 s (every 2 s on short axes), with 1 s minor ticks.
type secondTicks struct{}

func (secondTicks) Ticks(lo, hi float64) []plot.Tick {
	step := 5.0
	if hi-lo < 15 {
		step = 2
	}
	var out []plot.Tick
	for x := math.Ceil(lo); x <= hi; x++ {
		label := ""
		if math.Mod(x, step) == 0 {
			label = strconv.Itoa(int(x))
		}
		out = append(out, plot.Tick{Value: x, Label: label})
	}
	return out
}

// legendBox is a legend thumbnail: a filled box, optionally outlined.
type legendBox struct {
	fill    color.Color
	height  float64 // fraction of the thumbnail height
	outline *draw.LineStyle
}

func (l legendBox) Thumbnail(c *draw.Canvas) {
	h := (c.Max.Y - c.Min.Y) * vg.Length(l.height)
	mid := (c.Max.Y + c.Min.Y) / 2
	pts := []vg.Point{{X: c.Min.X, Y: mid - h/2}, {X: c.Max.X, Y: mid - h/2}, {X: c.Max.X, Y: mid + h/2}, {X: c.Min.X, Y: mid + h/2}}
	c.FillPolygon(l.fill, pts)
	if l.outline != nil {
		c.StrokeLines(*l.outline, append(pts, pts[0]))
	}
}

// WriteTimelines draws the timelines stacked on one shared time axis and
// writes a PNG.
func WriteTimelines(path string, tls []Timeline) error {
	if len(tls) == 0 {
		return fmt.Errorf("no timelines to draw")
	}
	end := 0.0
	for _, tl := range tls {
		end = math.Max(end, tl.End)
	}
	plots := make([][]*plot.Plot, len(tls))
	for i, tl := range tls {
		p := plot.New()
		p.Title.Text = tl.Title
		if tl.Caption != "" {
			p.Title.Text += "\n" + tl.Caption
		}
		p.Title.TextStyle.Font.Size = vg.Points(11)
		p.X.Label.Text = "seconds"
		p.X.Min, p.X.Max = 0, end
		p.X.Tick.Marker = secondTicks{}
		p.Add(plotter.NewGrid())
		p.Add(timelinePlotter{tl: tl})
		// An empty lane on top holds the legend and the marks' labels.
		lanes := slices.Clone(tl.Lanes)
		slices.Reverse(lanes)
		lanes = append(lanes, "")
		p.NominalY(lanes...)
		p.Y.Min, p.Y.Max = -0.5, float64(len(lanes))-0.5
		if i == 0 {
			p.Legend.Top = true
			p.Legend.Left = false
			p.Legend.TextStyle.Font.Size = vg.Points(8)
			p.Legend.YOffs = vg.Points(-4)
			blue := colorOf(0)
			p.Legend.Add("workload running / lock held (colour = allocation)", legendBox{fill: blue, height: 0.6})
			p.Legend.Add("lock still held for a killed holder", legendBox{fill: faded(blue), height: 0.6,
				outline: &draw.LineStyle{Color: blue, Width: vg.Points(1), Dashes: []vg.Length{vg.Points(3), vg.Points(2)}}})
			p.Legend.Add("supervisor waiting for the lock", legendBox{fill: lightGray, height: 0.25})
		}
		plots[i] = []*plot.Plot{p}
	}
	const width = 11 * vg.Inch
	height := vg.Length(len(tls)) * 3.1 * vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(110))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(tls), Cols: 1, PadTop: vg.Points(6), PadBottom: vg.Points(6),
		PadLeft: vg.Points(6), PadRight: vg.Points(14), PadY: vg.Points(14)}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	return writePNG(path, img)
}

// RatioBar is one bar of the ratio chart: a variant's median over the
// anchor's median for one metric (lower is better for every metric drawn).
type RatioBar struct {
	Metric  string
	Variant string
	Ratio   float64
}

// ratioPlotter draws grouped bars on a log Y axis: each bar rises from the
// axis' bottom to its ratio, labelled with the value. (plotter.BarChart
// starts its bars at 0, which a log axis cannot show.)
type ratioPlotter struct {
	bars              []RatioBar
	metrics, variants []string
	width             float64 // of one bar, in X data units
}

func (rp ratioPlotter) DataRange() (xmin, xmax, ymin, ymax float64) {
	ymin, ymax = 1, 1
	for _, b := range rp.bars {
		ymin, ymax = math.Min(ymin, b.Ratio), math.Max(ymax, b.Ratio)
	}
	return -0.5, float64(len(rp.metrics)) - 0.5, ymin, ymax
}

func (rp ratioPlotter) Plot(c draw.Canvas, plt *plot.Plot) {
	trX, trY := plt.Transforms(&c)
	label := plt.X.Tick.Label
	label.Font.Size = vg.Points(8)
	label.XAlign = draw.XCenter
	label.YAlign = draw.YBottom
	nv := float64(len(rp.variants))
	for _, b := range rp.bars {
		mi, vi := slices.Index(rp.metrics, b.Metric), slices.Index(rp.variants, b.Variant)
		if mi < 0 || vi < 0 || b.Ratio <= 0 {
			continue
		}
		x0 := float64(mi) - rp.width*nv/2 + float64(vi)*rp.width
		x1 := x0 + rp.width
		bottom, top := trY(plt.Y.Min), trY(b.Ratio)
		c.FillPolygon(colorOf(vi+1), []vg.Point{{X: trX(x0), Y: bottom}, {X: trX(x1), Y: bottom}, {X: trX(x1), Y: top}, {X: trX(x0), Y: top}})
		c.FillText(label, vg.Point{X: (trX(x0) + trX(x1)) / 2, Y: top + vg.Points(2)}, formatRatio(b.Ratio))
	}
}

// WriteRatios draws grouped bars (one group per metric, one bar per
// variant) on a log scale with a line at 1, the anchor, and writes a PNG.
// Metric names may hold "\n" to break the axis labels.
func WriteRatios(path string, bars []RatioBar) error {
	if len(bars) == 0 {
		return fmt.Errorf("no ratios to draw")
	}
	var metrics, variants []string
	lo, hi := 1.0, 1.0
	for _, b := range bars {
		if !slices.Contains(metrics, b.Metric) {
			metrics = append(metrics, b.Metric)
		}
		if !slices.Contains(variants, b.Variant) {
			variants = append(variants, b.Variant)
		}
		if b.Ratio > 0 {
			lo, hi = math.Min(lo, b.Ratio), math.Max(hi, b.Ratio)
		}
	}
	p := plot.New()
	p.Title.Text = "Median of each variant relative to nomad var lock (= 1), log scale: below 1 is better"
	p.Title.TextStyle.Font.Size = vg.Points(11)
	p.Y.Label.Text = "ratio to (a) nomad var lock"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Add(plotter.NewGrid())
	rp := ratioPlotter{bars: bars, metrics: metrics, variants: variants, width: 0.8 / float64(len(variants))}
	p.Add(rp)
	for vi, v := range variants {
		p.Legend.Add(v, legendBox{fill: colorOf(vi + 1), height: 0.7})
	}
	one, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: 1}, {X: float64(len(metrics)) - 0.5, Y: 1}})
	if err != nil {
		return err
	}
	one.LineStyle = draw.LineStyle{Color: colorOf(0), Width: vg.Points(1.5), Dashes: []vg.Length{vg.Points(5), vg.Points(3)}}
	p.Add(one)
	p.Legend.Add(VariantAnchor+" = 1", one)
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.NominalX(metrics...)
	p.X.Min, p.X.Max = -0.5, float64(len(metrics))-0.5
	p.Y.Min = math.Pow(10, math.Floor(math.Log10(lo*0.7)))
	p.Y.Max = math.Pow(10, math.Ceil(math.Log10(hi*2.5)))
	p.X.Tick.Label.Font.Size = vg.Points(9)

	width := vg.Length(max(8.0, 1.15*float64(len(metrics)))) * vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(width, 4.4*vg.Inch), vgimg.UseDPI(110))
	p.Draw(draw.New(img))
	return writePNG(path, img)
}

func writePNG(path string, img *vgimg.Canvas) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}
