// Package image writes container images without a registry or a daemon:
// files from this machine on an empty base, one layer, an OCI manifest,
// saved as an OCI archive that containerd (ctr images import) takes. The
// same files and options give the same bytes.
package image

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one file of the image.
type File struct {
	// Path inside the image (absolute).
	Path string
	// Source is the file on this machine; Data, when Source is empty.
	Source string
	Data   []byte
	Mode   os.FileMode
	// Link makes the entry a symbolic link to Link instead.
	Link string
}

// Spec says what goes in the image and how it runs.
type Spec struct {
	// Ref names the image in the tarball (repository:tag); Aliases are
	// more names for the same image (repository:latest).
	Ref        string
	Aliases    []string
	Files      []File
	Entrypoint []string
	Cmd        []string
	Env        []string
	User       string
	WorkingDir string
	Labels     map[string]string
	// Created is the image's and every file's time (default: the Unix
	// epoch, for reproducible builds).
	Created time.Time
	// Arch is the image's architecture (GOARCH names; default amd64).
	Arch string
}

// Write saves the image as an OCI archive at out (a tar of an OCI image
// layout, its index naming the image by Ref) and returns its digest.
func Write(out string, s Spec) (v1.Hash, error) {
	img, err := Build(s)
	if err != nil {
		return v1.Hash{}, err
	}
	return writeLayout(out, append([]string{s.Ref}, s.Aliases...), func(p layout.Path, o layout.Option) error {
		return p.AppendImage(img, o)
	}, img.Digest)
}

// WriteIndex saves one image per spec (each its Arch, all the same but
// for their files) as an OCI archive whose index names one multi-platform
// image index by the first spec's Ref and Aliases; it returns the image
// index's digest. containerd imports the platform of the machine (ctr
// images import --all-platforms: every one).
func WriteIndex(out string, specs []Spec) (v1.Hash, error) {
	if len(specs) == 0 {
		return v1.Hash{}, fmt.Errorf("no image to write")
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	seen := map[string]bool{}
	for _, s := range specs {
		arch := archOf(s)
		if seen[arch] {
			return v1.Hash{}, fmt.Errorf("two images for linux/%s", arch)
		}
		seen[arch] = true
		img, err := Build(s)
		if err != nil {
			return v1.Hash{}, err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img,
			Descriptor: v1.Descriptor{MediaType: types.OCIManifestSchema1, Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	return writeLayout(out, append([]string{specs[0].Ref}, specs[0].Aliases...), func(p layout.Path, o layout.Option) error {
		return p.AppendIndex(idx, o)
	}, idx.Digest)
}

func archOf(s Spec) string {
	if s.Arch == "" {
		return "amd64"
	}
	return s.Arch
}

// writeLayout writes an OCI layout holding what add appends, once per
// name in refs, as the archive out; digest is what it returns.
func writeLayout(out string, refs []string, add func(layout.Path, layout.Option) error, digest func() (v1.Hash, error)) (v1.Hash, error) {
	var parsed []name.Reference
	for _, r := range refs {
		ref, err := name.ParseReference(r)
		if err != nil {
			return v1.Hash{}, fmt.Errorf("image reference %q: %w", r, err)
		}
		parsed = append(parsed, ref)
	}
	dir, err := os.MkdirTemp("", "image-layout")
	if err != nil {
		return v1.Hash{}, err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, err
	}
	// containerd names an imported image by the first annotation, other
	// tools by the second; one index entry per name.
	for _, ref := range parsed {
		if err := add(p, layout.WithAnnotations(map[string]string{
			"io.containerd.image.name":          ref.Name(),
			"org.opencontainers.image.ref.name": ref.Identifier(),
		})); err != nil {
			return v1.Hash{}, err
		}
	}
	if err := archive(dir, out); err != nil {
		return v1.Hash{}, fmt.Errorf("writing %s: %w", out, err)
	}
	return digest()
}

// archive tars the layout at dir into out (written whole, then renamed),
// sorted and dated at the epoch so the same layout gives the same bytes.
func archive(dir, out string) error {
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		names = append(names, p)
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(names)
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	tw := tar.NewWriter(f)
	for _, p := range names {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: time.Unix(0, 0), Mode: 0o644, Typeflag: tar.TypeReg, Size: fi.Size()}
		if fi.IsDir() {
			h.Name, h.Mode, h.Typeflag, h.Size = h.Name+"/", 0o755, tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !fi.IsDir() {
			src, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, src)
			src.Close()
			if err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

// Build makes the image in memory.
func Build(s Spec) (v1.Image, error) {
	created := s.Created
	if created.IsZero() {
		created = time.Unix(0, 0).UTC()
	}
	layerTar, err := layer(s.Files, created)
	if err != nil {
		return nil, err
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{Layer: l, MediaType: types.OCILayer,
		History: v1.History{Created: v1.Time{Time: created}, CreatedBy: "salt-volumes image builder"}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Created = archOf(s), "linux", v1.Time{Time: created}
	cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.Env = s.Entrypoint, s.Cmd, s.Env
	cf.Config.User, cf.Config.WorkingDir, cf.Config.Labels = s.User, s.WorkingDir, s.Labels
	return mutate.ConfigFile(img, cf)
}

// layer is the tar of the files, with their parent directories, sorted,
// owned by root, all dated created.
func layer(files []File, created time.Time) ([]byte, error) {
	dirs := map[string]bool{}
	byPath := map[string]File{}
	for _, f := range files {
		p := path.Clean(f.Path)
		if !strings.HasPrefix(p, "/") || p == "/" {
			return nil, fmt.Errorf("image file %q: give an absolute path below /", f.Path)
		}
		if _, dup := byPath[p]; dup {
			return nil, fmt.Errorf("image file %q given twice", p)
		}
		byPath[p] = f
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	var names []string
	for d := range dirs {
		names = append(names, d)
	}
	for p := range byPath {
		names = append(names, p)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range names {
		h := &tar.Header{Name: strings.TrimPrefix(p, "/"), ModTime: created}
		f, isFile := byPath[p]
		switch {
		case !isFile:
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
		case f.Link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, f.Link, 0o777
		default:
			data := f.Data
			if f.Source != "" {
				var err error
				if data, err = os.ReadFile(f.Source); err != nil {
					return nil, fmt.Errorf("image file %s: %w", p, err)
				}
			}
			mode := f.Mode
			if mode == 0 {
				mode = 0o644
			}
			h.Typeflag, h.Mode, h.Size = tar.TypeReg, int64(mode.Perm()), int64(len(data))
			if err := tw.WriteHeader(h); err != nil {
				return nil, err
			}
			if _, err := tw.Write(data); err != nil {
				return nil, err
			}
			continue
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Unpack extracts an archive Write made into dir (an OCI image layout that
// layout.ImageIndexFromPath opens), refusing names that leave dir.
func Unpack(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", archive, err)
		}
		p := filepath.Join(dir, h.Name)
		if !strings.HasPrefix(p, filepath.Clean(dir)+string(filepath.Separator)) {
			return fmt.Errorf("%s: entry %q leaves the directory", archive, h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			w, err := os.Create(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(w, tr)
			if cerr := w.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: entry %q is neither a file nor a directory", archive, h.Name)
		}
	}
}
