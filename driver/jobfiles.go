package driver

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/hashicorp/nomad/client/allocdir"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// The plugin and the supervisor run as root, and a jobspec is written by
// someone who must not get root's powers. So a file a jobspec names is read
// only from the task's own secrets directory (where a template block renders
// it), as a regular file of bounded size, opened without following a symlink
// or leaving that directory: never a root-only file elsewhere, a FIFO that
// would hang the plugin, or a device that never ends.
const (
	maxAuthKeyBytes = 4 << 10
	maxCABytes      = 1 << 20
)

// resolveLBFiles replaces load_balancer.authkey_file and ca_file by the
// contents of those files, read as described above.
func resolveLBFiles(cfg *drivers.TaskConfig, blocks *shim.DriverBlocks) error {
	spec := &blocks.LoadBalancer
	var errs []error
	if spec.AuthKeyFile != "" {
		b, err := readSecretsFile(cfg, "config.load_balancer.authkey_file", spec.AuthKeyFile, maxAuthKeyBytes)
		errs = append(errs, err)
		spec.AuthKey, spec.AuthKeyFile = string(b), ""
	}
	if spec.CAFile != "" {
		b, err := readSecretsFile(cfg, "config.load_balancer.ca_file", spec.CAFile, maxCABytes)
		errs = append(errs, err)
		spec.CAPEM, spec.CAFile = b, ""
	}
	return errors.Join(errs...)
}

// readSecretsFile reads the file that jobspec field names, which must lie in
// the task's secrets directory: "secrets/<name>", or the same as an absolute
// path (${NOMAD_SECRETS_DIR}/<name>).
func readSecretsFile(cfg *drivers.TaskConfig, field, path string, max int64) ([]byte, error) {
	td := cfg.TaskDir()
	rel, ok := secretsRel(td, path)
	if !ok {
		return nil, fmt.Errorf("%s = %q: the driver reads only files in the task's secrets directory "+
			"(it runs as root, and a job must not choose what root reads): render the file with a template block "+
			"to \"secrets/<name>\" and set %s = \"secrets/<name>\"", field, path, field)
	}
	b, err := securefs.ReadBeneath(td.Dir, rel, max)
	if err != nil {
		return nil, fmt.Errorf("%s = %q: %w; it must be a regular file of at most %d bytes in the task's secrets directory "+
			"(not a symlink, FIFO, device or hard link)", field, path, err, max)
	}
	return b, nil
}

// secretsRel is path relative to the task dir if it names a file below the
// task's secrets directory.
func secretsRel(td *allocdir.TaskDir, path string) (string, bool) {
	abs := path
	if !filepath.IsAbs(abs) {
		abs = filepath.Join(td.Dir, path)
	}
	rel, err := filepath.Rel(td.Dir, filepath.Clean(abs))
	if err != nil {
		return "", false
	}
	secrets, err := filepath.Rel(td.Dir, td.SecretsDir)
	if err != nil || strings.HasPrefix(secrets, "..") {
		return "", false
	}
	if !strings.HasPrefix(rel, secrets+string(filepath.Separator)) {
		return "", false
	}
	return rel, true
}
