package lbhook

import (
	"errors"
	"net/url"
	"strings"
)

// redactedValue replaces the auth key wherever it would be shown.
const redactedValue = "REDACTED"

// redactor hides one secret in strings, URLs and errors.
type redactor struct{ secret string }

// String replaces every occurrence of the secret, raw or query-escaped.
func (r redactor) String(s string) string {
	if r.secret == "" {
		return s
	}
	s = strings.ReplaceAll(s, r.secret, redactedValue)
	if esc := url.QueryEscape(r.secret); esc != r.secret {
		s = strings.ReplaceAll(s, esc, redactedValue)
	}
	if esc := url.PathEscape(r.secret); esc != r.secret {
		s = strings.ReplaceAll(s, esc, redactedValue)
	}
	return s
}

// URL returns raw with the authkey parameter and any userinfo password hidden.
func (r redactor) URL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return r.String(raw)
	}
	q := u.Query()
	if q.Has(authKeyParam) {
		q.Set(authKeyParam, redactedValue)
		u.RawQuery = q.Encode()
	}
	return r.String(u.Redacted())
}

// Error rebuilds a *url.Error (which quotes the full URL, auth key included)
// around a redacted URL, so that nothing in the returned chain shows the key.
func (r redactor) Error(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return &url.Error{Op: ue.Op, URL: r.URL(ue.URL), Err: ue.Err}
	}
	return err
}
