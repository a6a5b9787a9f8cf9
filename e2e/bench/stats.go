package bench

import (
	"math"
	"slices"
)

// Summary is the median, min and max of one row's runs.
type Summary struct {
	N                int // values that count (NaN are dropped)
	Median, Min, Max float64
	Sum              float64
}

// Summarize drops NaN values (a run that could not measure) and summarises
// the rest. With no values every field but N is NaN.
func Summarize(values []float64) Summary {
	vs := make([]float64, 0, len(values))
	for _, v := range values {
		if !math.IsNaN(v) {
			vs = append(vs, v)
		}
	}
	s := Summary{N: len(vs), Median: math.NaN(), Min: math.NaN(), Max: math.NaN(), Sum: math.NaN()}
	if len(vs) == 0 {
		return s
	}
	slices.Sort(vs)
	s.Min, s.Max = vs[0], vs[len(vs)-1]
	if n := len(vs); n%2 == 1 {
		s.Median = vs[n/2]
	} else {
		s.Median = (vs[n/2-1] + vs[n/2]) / 2
	}
	s.Sum = 0
	for _, v := range vs {
		s.Sum += v
	}
	return s
}
