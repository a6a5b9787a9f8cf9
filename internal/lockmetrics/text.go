package lockmetrics

import (
	"bufio"
	"io"
	"strconv"
	"strings"
)

// TextContentType is the content type of WriteText's output: Prometheus's
// text exposition format 0.0.4.
const TextContentType = "text/plain; version=0.0.4; charset=utf-8"

// WriteText writes fams in Prometheus's text exposition format (what
// `lock -http-addr` serves; the plugin serves the same families through
// client_golang).
func WriteText(w io.Writer, fams []Family) error {
	bw := bufio.NewWriter(w)
	for _, f := range fams {
		d := f.Desc
		bw.WriteString("# HELP " + d.Name + " " + escapeHelp(d.Help) + "\n")
		bw.WriteString("# TYPE " + d.Name + " " + string(d.Kind) + "\n")
		names := d.LabelNames()
		for _, s := range f.Samples {
			if d.Kind != KindHistogram {
				writeSample(bw, d.Name, names, s.Labels, "", "", formatFloat(s.Value))
				continue
			}
			cum := s.Buckets(d)
			for _, b := range d.Buckets {
				writeSample(bw, d.Name+"_bucket", names, s.Labels, "le", formatFloat(b), formatUint(cum[b]))
			}
			writeSample(bw, d.Name+"_bucket", names, s.Labels, "le", "+Inf", formatUint(s.Hist.Count))
			writeSample(bw, d.Name+"_sum", names, s.Labels, "", "", formatFloat(s.Hist.Sum))
			writeSample(bw, d.Name+"_count", names, s.Labels, "", "", formatUint(s.Hist.Count))
		}
	}
	return bw.Flush()
}

func writeSample(w *bufio.Writer, name string, names, values []string, extraName, extraValue, value string) {
	w.WriteString(name)
	w.WriteByte('{')
	for i, n := range names {
		if i > 0 {
			w.WriteByte(',')
		}
		w.WriteString(n + `="` + escapeLabel(values[i]) + `"`)
	}
	if extraName != "" {
		w.WriteString("," + extraName + `="` + extraValue + `"`)
	}
	w.WriteString("} " + value + "\n")
}

func formatUint(n uint64) string { return strconv.FormatUint(n, 10) }

var (
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
)

func escapeHelp(s string) string  { return helpEscaper.Replace(s) }
func escapeLabel(s string) string { return labelEscaper.Replace(strings.ToValidUTF8(s, "\uFFFD")) }
