#!/usr/bin/env bash
# build.sh [ROOT]: the test cluster's four server binaries (kube-apiserver, kubelet,
# kube-controller-manager, kube-scheduler, v1.20.2) built from Debian bookworm's own `kubernetes`
# source package into ROOT/bin, plus the Debian packages the cluster runs on (etcd, containerd, runc,
# CNI plugins). Nothing of it is ever committed: ROOT is a cache outside the repository, by default
# /var/cache/workbench-k8s. Keep ROOT fixed: Go's build cache (ROOT/gocache) is keyed by the absolute
# source path, so a moved ROOT rebuilds from cold (~20 min on 2 cores; warm, with the cache, ~30 s).
#
# Idempotent: each step is skipped when its result is there; with ROOT/bin complete it only checks the
# packages and exits within a second. Needs root (apt-get). NICE (default 19) and JOBS (default nproc)
# set the build's niceness and `go build -p`; GOMAXPROCS (default JOBS) bounds each Go process's threads
# too (with -p 1 Go otherwise compiles one package on every core): JOBS=1 keeps the build to one core,
# as .ci/run does while the suite runs beside it.
#
# The cache: the tests need only ROOT/bin (~350 MB); keep it between CI runs (a CI cache of
# /var/cache/workbench-k8s, or WORKBENCH_K8S_ROOT pointed at one) and this script is a second. Keep
# ROOT/gocache (~1.5 GB) too and a rebuild after a change here takes seconds, not the cold ~12-20 min.
#
# Three things the pristine 1.20.2 tree needs with Debian's Go 1.19 (found by /work/shared's recipe):
#   1. GOPATH mode (module mode stops at "updates to go.mod needed, disabled by -mod=vendor");
#   2. pkg/generated/openapi is not in the tarball: generate it with the vendored openapi-gen;
#   3. the vendored modern-go/reflect2 1.0.1 crashes at run time on Go >= 1.18 (a fault in
#      UnsafeMapType.UnsafeIterate on the first JSON map): replace it with Debian's 1.0.2.
set -euo pipefail

ROOT=$(realpath -m "${1:-${WORKBENCH_K8S_ROOT:-/var/cache/workbench-k8s}}")
NICE=${NICE:-19}
JOBS=${JOBS:-$(nproc)}
export GOMAXPROCS=${GOMAXPROCS:-$JOBS}
BINS="kube-apiserver kubelet kube-controller-manager kube-scheduler"
T0=$(date +%s)
log() { echo "[k8s-build +$(( $(date +%s) - T0 ))s] $*"; }
[ "$(id -u)" = 0 ] || { echo "build.sh needs root (apt-get, and the cluster runs as root)" >&2; exit 1; }
mkdir -p "$ROOT/bin" "$ROOT/gocache"
# one build at a time: .ci/run starts one in the background and the test fixture's call waits for it here
exec 9>"$ROOT/.build.lock"
flock 9

# ---- 1. Debian packages: the build's and the running cluster's
PKGS="golang-go etcd-server etcd-client containerd runc containernetworking-plugins
      golang-github-modern-go-reflect2-dev gcc libc6-dev openssl iproute2 util-linux"
missing=$(for p in $PKGS; do
  dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii' || echo "$p"; done)
if [ -n "$missing" ]; then
  log "installing Debian packages: $(echo $missing)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  # apt starts the packaged services; this cluster runs its own daemons (own sockets and ports)
  for s in containerd etcd; do
    if command -v systemctl >/dev/null && systemctl is-active --quiet "$s" 2>/dev/null; then
      systemctl disable --now "$s" >/dev/null 2>&1 || true
    fi
  done
fi

have_all() { for c in $BINS; do [ -x "$ROOT/bin/$c" ] || return 1; done; }
if have_all; then log "binaries present in $ROOT/bin"; exit 0; fi

# ---- 2. the source, through apt with a private source list (never writes /etc/apt)
export GOPATH=$ROOT/gopath GO111MODULE=off CGO_ENABLED=0 GOPROXY=off GOFLAGS= GOCACHE=$ROOT/gocache
K=$GOPATH/src/k8s.io/kubernetes
if [ ! -d "$K/cmd/kube-apiserver" ]; then
  A=$ROOT/aptsrc
  mkdir -p "$A/lists/partial" "$A/cache/archives/partial" "$ROOT/src"
  . /etc/os-release
  MIRROR="" KEYRING=""
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    read -r MIRROR KEYRING < <(awk -v cn="$VERSION_CODENAME" '
      function flush() { if (uri != "" && hit && out == "") out = uri " " key; uri = ""; key = ""; hit = 0 }
      /^[[:space:]]*$/ { flush(); next }
      /^URIs:/ { uri = $2 }  /^Signed-By:/ { key = $2 }
      /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == cn) hit = 1 }
      END { flush(); print out }' /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$MIRROR" ] && [ -f /etc/apt/sources.list ]; then
    MIRROR=$(awk -v cn="$VERSION_CODENAME" '$1 == "deb" { for (i = 2; i <= NF; i++)
      if ($i == cn && $(i-1) !~ /^\[/) { print $(i-1); exit } }' /etc/apt/sources.list)
  fi
  [ -n "$MIRROR" ] || { echo "no Debian mirror for $VERSION_CODENAME in /etc/apt" >&2; exit 1; }
  echo "deb-src ${KEYRING:+[signed-by=$KEYRING] }$MIRROR $VERSION_CODENAME main" > "$A/sources.list"
  APT=(-o "Dir::Etc::sourcelist=$A/sources.list" -o "Dir::Etc::sourceparts=/nonexistent"
       -o "Dir::State::Lists=$A/lists" -o "Dir::Cache=$A/cache")
  # apt verifies signatures as the user _apt; where /dev/null is not writable for others (seen on
  # sandboxed build machines) that fails with "gpgv ... required", so verify as root there
  [ "$(stat -c %a /dev/null)" = 666 ] || APT+=(-o APT::Sandbox::User=root)
  log "source: $(cat "$A/sources.list")"
  apt-get "${APT[@]}" -qq update
  ( cd "$ROOT/src" && apt-get "${APT[@]}" -qq source --download-only kubernetes >/dev/null )
  ORIG=$(ls "$ROOT"/src/kubernetes_*.orig.tar.gz | tail -1)
  mkdir -p "$K"
  log "unpacking $(basename "$ORIG")"
  tar xzf "$ORIG" -C "$K" --strip-components=1
fi

# fix 3: reflect2 1.0.2 (Debian's) instead of the vendored 1.0.1
R2=$K/vendor/github.com/modern-go/reflect2
if [ ! -f "$R2/go_above_118.go" ]; then
  log "fix: vendored reflect2 1.0.1 -> Debian's 1.0.2"
  rm -f "$R2"/*.go "$R2"/*.s
  for f in /usr/share/gocode/src/github.com/modern-go/reflect2/*.go /usr/share/gocode/src/github.com/modern-go/reflect2/*.s; do
    case "$f" in *_test.go) ;; *) cp "$f" "$R2/" ;; esac
  done
fi
# fix 2: the generated OpenAPI definitions kube-apiserver needs
if [ ! -f "$K/pkg/generated/openapi/zz_generated.openapi.go" ]; then
  log "fix: generating pkg/generated/openapi with the vendored openapi-gen"
  mkdir -p "$ROOT/tools"
  ( cd "$K" && nice -n "$NICE" go build -o "$ROOT/tools/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen )
  DIRS=$(cd "$K" && { grep -rl --include='*.go' '^// *+k8s:openapi-gen=' pkg cmd plugin
                      grep -Rl --include='*.go' '^// *+k8s:openapi-gen=' vendor/k8s.io; } \
         | grep -v -E '^vendor/k8s.io/(code-generator|sample-apiserver)/' | xargs -n1 dirname | sort -u \
         | sed 's#^#k8s.io/kubernetes/#' | paste -sd, -)
  ( cd "$K" && nice -n "$NICE" "$ROOT/tools/openapi-gen" --logtostderr -i "$DIRS" \
      -p k8s.io/kubernetes/pkg/generated/openapi -O zz_generated.openapi \
      -h hack/boilerplate/boilerplate.generatego.txt -r "$ROOT/tools/openapi-violations.txt" ) 2>/dev/null
fi

# ---- 3. the four binaries
V=k8s.io/kubernetes/vendor/k8s.io
LD="-s -w -X $V/component-base/version.gitVersion=v1.20.2 -X $V/component-base/version.gitMajor=1
 -X $V/component-base/version.gitMinor=20 -X $V/component-base/version.gitTreeState=clean
 -X $V/client-go/pkg/version.gitVersion=v1.20.2"
cd "$K"
for c in $BINS; do
  [ -x "$ROOT/bin/$c" ] && continue
  s=$(date +%s); log "$c: go build -p $JOBS"
  nice -n "$NICE" go build -p "$JOBS" -ldflags "$LD" -o "$ROOT/bin/.$c.tmp" "k8s.io/kubernetes/cmd/$c"
  mv -f "$ROOT/bin/.$c.tmp" "$ROOT/bin/$c"
  log "$c: built in $(( $(date +%s) - s ))s"
done
log "done: $("$ROOT/bin/kube-apiserver" --version), binaries $(du -sh "$ROOT/bin" | cut -f1), Go cache $(du -sh "$ROOT/gocache" | cut -f1)"
