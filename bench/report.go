package bench

import (
	"fmt"
	"html/template"
	"io"
	"strings"
)

// WriteReport writes a self-contained HTML page (inline SVG, no network) of
// a run: throughput over time, latency percentiles, the run's figures and,
// when given, the comparison table.
func WriteReport(w io.Writer, r *Result, cmp []CompareRow) error {
	var sb strings.Builder
	PrintResult(&sb, r)
	return reportTmpl.Execute(w, map[string]any{
		"R": r, "Text": sb.String(), "Chart": template.HTML(throughputSVG(r.Series)), "Compare": cmp,
	})
}

// throughputSVG draws keys/s over wall time, with a tick where the
// simulated clock crossed into a new partition drop.
func throughputSVG(series []Point) string {
	const w, h, pad = 800.0, 260.0, 40.0
	if len(series) == 0 {
		return "<p>no samples</p>"
	}
	maxX, maxY := series[len(series)-1].At.Seconds(), 1.0
	for _, p := range series {
		maxY = max(maxY, p.KeysPerSec)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="11">`, w, h)
	fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#888"/>`, pad, h-pad, w-10, h-pad)
	fmt.Fprintf(&b, `<line x1="%.0f" y1="10" x2="%.0f" y2="%.0f" stroke="#888"/>`, pad, pad, h-pad)
	x := func(s float64) float64 { return pad + (w-pad-10)*s/maxX }
	y := func(v float64) float64 { return h - pad - (h-pad-10)*v/maxY }
	var pts []string
	var last uint64
	for _, p := range series {
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p.At.Seconds()), y(p.KeysPerSec)))
		if p.Rotations > last {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="10" x2="%.1f" y2="%.0f" stroke="#e99" stroke-dasharray="3,3"><title>partition dropped</title></line>`, x(p.At.Seconds()), x(p.At.Seconds()), h-pad)
			last = p.Rotations
		}
	}
	fmt.Fprintf(&b, `<polyline fill="none" stroke="#2a6" stroke-width="1.5" points="%s"/>`, strings.Join(pts, " "))
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">0</text><text x="%.0f" y="%.0f">%.0fs</text>`, pad, h-pad+14, w-40, h-pad+14, maxX)
	fmt.Fprintf(&b, `<text x="2" y="14">%.0fk keys/s</text><text x="2" y="%.0f">0</text>`, maxY/1000, h-pad)
	b.WriteString(`</svg>`)
	return b.String()
}

var reportTmpl = template.Must(template.New("report").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>dedupbench: {{.R.Tiers}}</title>
<style>body{font-family:sans-serif;max-width:60em;margin:2em auto;color:#222}
pre{background:#f6f6f6;padding:1em;overflow:auto}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:.3em .6em;text-align:right}th{background:#eee}</style></head>
<body>
<h1>dedupbench: {{.R.Tiers}}</h1>
<h2>Throughput over time</h2>
<p>Keys per second each second of the run; dashed red lines mark partition drops (retention).</p>
{{.Chart}}
<h2>Latency</h2>
<table><tr><th></th><th>p50</th><th>p99</th><th>p99.9</th><th>max</th></tr>
<tr><th>batch</th><td>{{.R.BatchLatency.P50}}</td><td>{{.R.BatchLatency.P99}}</td><td>{{.R.BatchLatency.P999}}</td><td>{{.R.BatchLatency.Max}}</td></tr>
<tr><th>per key</th><td>{{.R.KeyLatency.P50}}</td><td>{{.R.KeyLatency.P99}}</td><td>{{.R.KeyLatency.P999}}</td><td>{{.R.KeyLatency.Max}}</td></tr></table>
<h2>Figures</h2>
<pre>{{.Text}}</pre>
{{if .Compare}}<h2>Side by side</h2>
<table><tr><th>what</th><th>keys</th><th>keys/s</th><th>engine is</th></tr>
{{range .Compare}}<tr><th>{{.Name}}</th><td>{{.Keys}}</td><td>{{printf "%.0f" .KeysPerSec}}</td><td>{{if .Ratio}}{{printf "%.1f×" .Ratio}}{{end}}</td></tr>
{{end}}</table>{{end}}
</body></html>
`))
