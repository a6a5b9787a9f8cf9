// Command ociimage writes the OCI image of `lock`: one layer (a tar made by
// the release script), an entrypoint, labels, every time set to
// SOURCE_DATE_EPOCH, as an OCI image layout directory (go-containerregistry)
// that also holds Docker's manifest.json, so that `docker load` takes its
// tar whatever the engine's version, and podman, skopeo and crane read it as
// an OCI archive. The same inputs give the same bytes.
//
//	ociimage -layer layer.tar -arch amd64 -ref nomad-driver-singleton/lock:0.2.0 \
//	         -entrypoint /usr/local/bin/lock -version 0.2.0 -out DIR
package main

import (
	"compress/gzip"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func main() {
	layerTar := flag.String("layer", "", "the layer, an uncompressed tar")
	arch := flag.String("arch", "amd64", "the image's architecture (GOARCH)")
	ref := flag.String("ref", "", "the image's name:tag, as docker load tags it")
	entrypoint := flag.String("entrypoint", "", "the entrypoint, a path in the layer")
	version := flag.String("version", "", "the version, for the image's labels")
	out := flag.String("out", "", "the OCI image layout directory to write (must not exist)")
	flag.Parse()
	if *layerTar == "" || *ref == "" || *out == "" || *entrypoint == "" {
		flag.Usage()
		os.Exit(64)
	}
	if err := write(*layerTar, *arch, *ref, *entrypoint, *version, *out); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

func write(layerTar, arch, ref, entrypoint, version, out string) error {
	epoch, err := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64)
	if err != nil {
		return fmt.Errorf("SOURCE_DATE_EPOCH: %w", err)
	}
	created := v1.Time{Time: time.Unix(epoch, 0).UTC()}

	layer, err := tarball.LayerFromFile(layerTar, tarball.WithMediaType(types.OCILayer),
		tarball.WithCompressionLevel(gzip.BestCompression))
	if err != nil {
		return err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{Layer: layer, History: v1.History{
		Created: created, CreatedBy: "scripts/release.sh", Comment: "lock, a static binary"}})
	if err != nil {
		return err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture, cfg.Created = "linux", arch, created
	cfg.Config.Entrypoint = []string{entrypoint}
	cfg.Config.Labels = map[string]string{
		"org.opencontainers.image.title":       "lock",
		"org.opencontainers.image.description": "runs a command only while it holds a Nomad Variable lock",
		"org.opencontainers.image.version":     version,
		"org.opencontainers.image.licenses":    "MPL-2.0",
		"org.opencontainers.image.created":     created.Format(time.RFC3339),
	}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return err
	}

	p, err := layout.Write(out, empty.Index)
	if err != nil {
		return err
	}
	name, tag, _ := strings.Cut(ref, ":")
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag,
		"io.containerd.image.name":          name + ":" + tag,
	})); err != nil {
		return err
	}
	return writeDockerManifest(out, img, ref)
}

// writeDockerManifest adds Docker's manifest.json, which names the config
// and layer blobs of the layout: what `docker load` reads before Docker 25
// (which reads the OCI layout itself too).
func writeDockerManifest(dir string, img v1.Image, ref string) error {
	cfgName, err := img.ConfigName()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	var paths []string
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		paths = append(paths, "blobs/"+d.Algorithm+"/"+d.Hex)
	}
	b, err := json.Marshal([]struct {
		Config   string
		RepoTags []string
		Layers   []string
	}{{Config: "blobs/" + cfgName.Algorithm + "/" + cfgName.Hex, RepoTags: []string{ref}, Layers: paths}})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "manifest.json"), b, 0o644)
}
