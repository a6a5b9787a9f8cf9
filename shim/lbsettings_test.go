package shim

import (
	"reflect"
	"testing"

	"github.com/zclconf/go-cty/cty"
)

// Each LB and health setting is declared once (a field with its hcl tag,
// plus its usage): every one has a usage, and merging and IsZero see
// every field, whatever its type.
func TestLBSettingsDeclaredOnce(t *testing.T) {
	if len(LBSettings) != 19 || len(HealthSettings) != 6 {
		t.Fatalf("%d load_balancer and %d health_check settings: a field lost its hcl tag?", len(LBSettings), len(HealthSettings))
	}
	for _, s := range append(append([]LBSetting(nil), LBSettings...), HealthSettings...) {
		if s.Usage == "" && s.Name != "options" {
			t.Errorf("%s.%s has no usage", s.Block, s.Name)
		}
	}
	// A spec with every setting set is not zero, and each alone is not zero.
	for _, s := range LBSettings {
		var spec LBSpec
		switch v := s.Field(&spec); v.Kind() {
		case reflect.String:
			v.SetString("x")
		case reflect.Slice:
			v.Set(reflect.ValueOf([]string{"x"}))
		default:
			v.Set(reflect.ValueOf(cty.ObjectVal(map[string]cty.Value{"k": cty.StringVal("v")})))
		}
		if spec.IsZero() {
			t.Errorf("a spec with only %s set is zero", s.Name)
		}
		if merged := MergeLB(LBSpec{}, spec); !reflect.DeepEqual(merged, spec) && s.Type != "any" {
			t.Errorf("%s set in the flags is lost in the merge: %+v", s.Name, merged)
		}
		if merged := MergeLB(spec, LBSpec{}); !reflect.DeepEqual(merged, spec) {
			t.Errorf("%s set in the file is lost in the merge: %+v", s.Name, merged)
		}
	}
	if !(LBSpec{}).IsZero() || (LBSpec{Options: map[string]any{}}).IsZero() {
		t.Error("IsZero is wrong about options")
	}
	h := MergeHealth(HealthSpec{Type: "http", Path: "/a"}, HealthSpec{Path: "/b"})
	if h != (HealthSpec{Type: "http", Path: "/b"}) {
		t.Errorf("MergeHealth = %+v", h)
	}
}
