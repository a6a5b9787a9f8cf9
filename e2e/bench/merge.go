package bench

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
)

// MergeDoc puts the sections of a report of some scenarios (fresh, as
// Report.Markdown renders it) into a report of every scenario (old, the
// same layout): for each scenario title "N. …" in titles, the Goals rows
// and the raw-value rows of scenario N and its "### N." section are
// replaced by fresh's, and stamp is added under that section's heading.
// The rest of old (its header, pictures, machine) is kept: stamp must say
// where the re-measured section comes from. A section old does not have yet
// (a new scenario) goes at the end of its "## Results", and the table of
// contents is made again.
func MergeDoc(old, fresh string, titles []string, stamp string) (string, error) {
	oldLines, freshLines := strings.Split(old, "\n"), strings.Split(fresh, "\n")
	added := false
	for _, title := range titles {
		num, _, ok := strings.Cut(title, ". ")
		if !ok {
			return "", fmt.Errorf("scenario title %q has no number", title)
		}
		rowPrefix, heading := "| "+num+". ", "### "+num+". "
		var err error
		isRow := func(l string) bool { return strings.HasPrefix(l, "|") }
		for _, part := range []string{"## Goals", "## Raw values"} {
			rows := linesIn(freshLines, part, func(l string) bool { return strings.HasPrefix(l, rowPrefix) })
			if oldLines, err = replaceRows(oldLines, part, rowPrefix, rows, isRow); err != nil {
				return "", err
			}
		}
		// The Goals part's list of figures not better than the anchor:
		// its items of this scenario, after the others.
		itemPrefix := "- " + num + ". "
		isItem := func(l string) bool { return strings.HasPrefix(l, "- ") }
		items := linesIn(freshLines, "## Goals", func(l string) bool { return strings.HasPrefix(l, itemPrefix) })
		if len(items) == 0 || len(linesIn(oldLines, "## Goals", isItem)) > 0 {
			if oldLines, err = replaceRows(oldLines, "## Goals", itemPrefix, items, isItem); err != nil {
				return "", err
			}
		}
		sec := section(freshLines, heading)
		if sec == nil {
			return "", fmt.Errorf("the new report has no section %q", heading)
		}
		sec = append([]string{sec[0], "", stamp}, sec[1:]...)
		if section(oldLines, heading) == nil {
			if oldLines, err = appendToPart(oldLines, "## Results", sec); err != nil {
				return "", err
			}
			added = true
			continue
		}
		if oldLines, err = replaceSection(oldLines, heading, sec); err != nil {
			return "", err
		}
	}
	if added {
		return withTOC(strings.Join(withoutTOC(oldLines), "\n")), nil
	}
	return strings.Join(oldLines, "\n"), nil
}

// appendToPart puts sec at the end of the "## " part named heading.
func appendToPart(lines []string, heading string, sec []string) ([]string, error) {
	start := slices.Index(lines, heading)
	if start < 0 {
		return nil, fmt.Errorf("the report has no part %q", heading)
	}
	end := start + 1
	for end < len(lines) && !strings.HasPrefix(lines[end], "## ") {
		end++
	}
	return insertAt(lines, end, sec), nil
}

// withoutTOC drops the table of contents withTOC put before the first "## "
// heading (its entries and the blank line after them).
func withoutTOC(lines []string) []string {
	var out []string
	toc := false
	for i, l := range lines {
		if strings.HasPrefix(l, "## ") {
			return append(out, lines[i:]...)
		}
		isEntry := (strings.HasPrefix(l, "- [") || strings.HasPrefix(l, "  - [")) && strings.Contains(l, "](#")
		switch {
		case isEntry:
			toc = true
		case toc && l == "":
			toc = false
		default:
			out = append(out, l)
		}
	}
	return out
}

// linesIn returns the lines of the "## " part named heading that match.
func linesIn(lines []string, heading string, match func(string) bool) []string {
	var out []string
	in := false
	for _, l := range lines {
		if strings.HasPrefix(l, "## ") {
			in = l == heading
			continue
		}
		if in && match(l) {
			out = append(out, l)
		}
	}
	return out
}

// replaceRows swaps the lines starting with prefix (table rows, or list
// items) in the part named heading for rows, at the place of the first old
// one (or after the part's last line that isRow: a table row, a list
// item).
func replaceRows(lines []string, heading, prefix string, rows []string, isRow func(string) bool) ([]string, error) {
	var out []string
	in, placed, found, lastRow := false, false, false, -1
	for _, l := range lines {
		if strings.HasPrefix(l, "## ") {
			if in && !placed {
				out = insertAt(out, lastRow+1, rows)
				placed = true
			}
			in = l == heading
			found = found || in
		}
		if in && strings.HasPrefix(l, prefix) {
			if !placed {
				out, placed = append(out, rows...), true
			}
			continue
		}
		out = append(out, l)
		if in && isRow(l) {
			lastRow = len(out) - 1
		}
	}
	if in && !placed {
		out = insertAt(out, lastRow+1, rows)
	}
	if !found {
		return nil, fmt.Errorf("the report has no part %q", heading)
	}
	return out, nil
}

func insertAt(lines []string, i int, add []string) []string {
	if i <= 0 {
		i = len(lines)
	}
	return append(lines[:i:i], append(add, lines[i:]...)...)
}

// section returns the lines from the one starting with heading up to the
// next "### " or "## " heading.
func section(lines []string, heading string) []string {
	for i, l := range lines {
		if !strings.HasPrefix(l, heading) {
			continue
		}
		j := i + 1
		for j < len(lines) && !strings.HasPrefix(lines[j], "### ") && !strings.HasPrefix(lines[j], "## ") {
			j++
		}
		return lines[i:j]
	}
	return nil
}

func replaceSection(lines []string, heading string, sec []string) ([]string, error) {
	old := section(lines, heading)
	if old == nil {
		return nil, fmt.Errorf("the report has no section %q to replace", heading)
	}
	for i, l := range lines {
		if l == old[0] {
			return append(lines[:i:i], append(sec, lines[i+len(old):]...)...), nil
		}
	}
	return nil, errors.New("unreachable")
}

// MergeIntoDoc renders rep (a run of some scenarios) into the report at
// mdPath, which must exist, keeping everything else there (see MergeDoc).
func MergeIntoDoc(rep *Report, mdPath string) error {
	old, err := os.ReadFile(mdPath)
	if err != nil {
		return fmt.Errorf("merge into %s: %w", mdPath, err)
	}
	var titles []string
	for _, s := range rep.Config.Scenarios {
		if t, ok := scenarioTitles[s]; ok {
			titles = append(titles, t)
		}
	}
	stamp := fmt.Sprintf("*Re-measured alone by `%s` on %s in %s (commit %s, load average %s at the start); the rest of this document comes from the run named at the top.*",
		rep.Config.Command, rep.Started.UTC().Format("2006-01-02 15:04 MST"), rep.Took.Round(1e9), rep.Machine.Commit, rep.Machine.LoadAtStart)
	if notes := rep.Notes(); len(notes) > 0 {
		stamp += " Observations from that run: " + strings.Join(notes, " ")
	}
	merged, err := MergeDoc(string(old), rep.Markdown(nil), titles, stamp)
	if err != nil {
		return fmt.Errorf("merge into %s: %w", mdPath, err)
	}
	tmp := mdPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(merged), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, mdPath)
}

// scenarioTitles maps a scenario name to its section title; scenarios
// without a section of their own (timeline: a picture) are absent.
var scenarioTitles = map[string]string{
	ScenarioHandover: TitleHandover, ScenarioCrash: TitleCrash, ScenarioStart: TitleStart, ScenarioFootprint: TitleFootprint,
	ScenarioScale: TitleScale, ScenarioLB: TitleLB, ScenarioHAProxy: TitleHAProxy, ScenarioSemaphore: TitleSemaphore,
	ScenarioUpdate: TitleUpdate, ScenarioLeaseCost: TitleLeaseCost, ScenarioNodeDeath: TitleNodeDeath, ScenarioMetrics: TitleMetrics,
}
