#!/usr/bin/env bash
# Build the Dockerfile with buildah (no Docker engine needed) and smoke-test the image for real:
# start the server inside it, then check /health/ready, one /v1/translate and /metrics on loopback.
#
#   sudo scripts/container-smoke.sh            (root: buildah --isolation chroot)
#   sudo GPU=1 scripts/container-smoke.sh      the GPU image: PyPI's torch (CUDA 13); with no GPU here it
#                                              checks that device=cuda is refused and device=auto serves on CPU
#
# With no registry for base images, it makes a local one (Debian bookworm + python3) with debootstrap
# from this machine's own apt mirror, and feeds the CPU torch wheel from the local pip wheel
# directory (or PyPI's torch, if none) through docker/wheels/. Takes several minutes the first time
# (debootstrap + pip); later runs reuse the base image and build cache. Not part of `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-localhost/nmt-serve:smoke}
BASE=${BASE:-localhost/bookworm-python:latest}
WORK=${WORK:-$PWD/.container}
PORT=${PORT:-18080}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
GPU=${GPU:-}
if [ -n "$GPU" ]; then IMAGE=${IMAGE%:smoke}; IMAGE=${IMAGE}:${IMAGE_TAG:-gpu-smoke}; fi
t0=$(date +%s)
say() { printf '[%4ss] %s\n' "$(( $(date +%s) - t0 ))" "$*"; }

missing=""
for tool in buildah debootstrap curl; do command -v "$tool" >/dev/null || missing="$missing $tool"; done
if [ -n "$missing" ]; then
  say "installing$missing"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
fi
mkdir -p "$WORK"

if ! buildah inspect --type image "$BASE" >/dev/null 2>&1; then
  mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
  mirror=${mirror:-$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list)}
  say "making base image $BASE with debootstrap (bookworm, python3)"
  rm -rf "$WORK/rootfs"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$WORK/rootfs" "$mirror" >"$WORK/debootstrap.log"
  rm -rf "$WORK/rootfs/var/cache/apt/archives/"*.deb "$WORK/rootfs/var/lib/apt/lists/"*
  ctr=$(buildah from scratch)
  buildah copy --quiet "$ctr" "$WORK/rootfs" / >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
  buildah commit --quiet "$ctr" "$BASE" >/dev/null
  buildah rm "$ctr" >/dev/null
fi

wheel=""
[ -z "$GPU" ] && wheel=$(ls /opt/wheels/torch-"$TORCH_VERSION"*cp311*x86_64.whl 2>/dev/null | head -n1 || true)
rm -f docker/wheels/*.whl
if [ -n "$wheel" ]; then cp "$wheel" docker/wheels/; say "torch from local wheel $(basename "$wheel")"; fi

# behind a TLS-intercepting proxy pip inside the build needs this machine's CA bundle
ca_bundle=${EXTRA_CA:-/etc/ssl/certs/ca-certificates.crt}
rm -f docker/certs/extra-ca.crt
[ -s "$ca_bundle" ] && cp "$ca_bundle" docker/certs/extra-ca.crt

say "building $IMAGE"
built=$(date +%s)
# docker format: the OCI format drops HEALTHCHECK
buildah bud --isolation chroot --layers --quiet --format docker \
  --build-arg BASE_IMAGE="$BASE" --build-arg TORCH_VERSION="$TORCH_VERSION" --build-arg TORCH_INDEX_URL= \
  --build-arg VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)" \
  --build-arg REVISION="$(git rev-parse HEAD 2>/dev/null || true)" --build-arg SOURCE="${SOURCE:-}" \
  -t "$IMAGE" . >"$WORK/build.log"
rm -f docker/wheels/*.whl docker/certs/extra-ca.crt
say "image built in $(( $(date +%s) - built ))s: $(buildah images --format '{{.Size}}' "$IMAGE" | head -n1)"

config=$(buildah inspect --type image "$IMAGE")
echo "$config" | grep -q '"Healthcheck"' || { echo "no HEALTHCHECK in the image"; exit 1; }
echo "$config" | grep -q '"org.opencontainers.image.revision"' || { echo "no OCI labels in the image"; exit 1; }
! echo "$config" | grep -qE '"Volumes": *\{ *$' || { echo "the image declares a VOLUME"; exit 1; }
say "HEALTHCHECK, OCI labels, no VOLUME: ok"

ctr=$(buildah from "$IMAGE")
cleanup() { [ -n "${server:-}" ] && kill "$server" 2>/dev/null; wait 2>/dev/null; buildah rm "$ctr" >/dev/null 2>&1 || true; }
trap cleanup EXIT
inside() { buildah run --isolation chroot --user app "$ctr" -- "$@"; }
lean=$(inside python3 -c "
import importlib.util as u, pathlib, torch
sp = pathlib.Path(torch.__file__).parents[1]
left = [m for m in ('pip', 'setuptools', 'wheel', 'sacrebleu', 'lxml') if u.find_spec(m)]
left += [str(p.relative_to(sp)) for p in (sp / 'torch/test', sp / 'torch/include') if p.exists()]
print(' '.join(left) or 'lean', torch.__version__, 'cuda', torch.version.cuda)")
say "inside the image: $lean"
case "$lean" in lean*) ;; *) echo "left in the image: $lean"; exit 1;; esac
if [ -n "$GPU" ]; then
  # no GPU on this machine: an explicit cuda must be refused in one line, and auto must serve on CPU
  refused=$(buildah run --isolation chroot --user app --env NMT_DEVICE=cuda "$ctr" -- python3 -m nmt_serve.service 2>&1 && echo "exit 0" || echo "exit $?")
  say "NMT_DEVICE=cuda here -> $refused"
  echo "$refused" | grep -q "not usable" && echo "$refused" | grep -q "exit 2"
fi
say "starting the server inside the image on 127.0.0.1:$PORT (user app)"
buildah run --isolation chroot --user app --env NMT_PORT="$PORT" --env NMT_HOST=127.0.0.1 "$ctr" -- python3 -m nmt_serve.service >"$WORK/server.log" 2>&1 &
server=$!
for _ in $(seq 1 180); do
  curl -sf "http://127.0.0.1:$PORT/health/ready" >/dev/null && break
  kill -0 "$server" 2>/dev/null || { cat "$WORK/server.log"; echo "server exited"; exit 1; }
  sleep 1
done
say "GET /health/ready -> $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health/ready") $(curl -s "http://127.0.0.1:$PORT/health/ready")"
reply=$(curl -sf "http://127.0.0.1:$PORT/v1/translate" -H 'content-type: application/json' \
  -d '{"text": ["Ein Hund rennt über die Wiese.", "Zwei Kinder spielen im Schnee."], "source": "de", "target": "en"}')
say "POST /v1/translate -> $reply"
echo "$reply" | grep -q '"translations"'
metrics=$(curl -sf "http://127.0.0.1:$PORT/metrics")
say "GET /metrics -> $(echo "$metrics" | grep -c '^nmt_') nmt_ samples, e.g. $(echo "$metrics" | grep '^nmt_requests_total' | head -n1)"
echo "$metrics" | grep -q 'nmt_requests_total{endpoint="/v1/translate",status="200"} 1.0'
whoami_in=$(buildah run --isolation chroot --user app "$ctr" -- id -un)
say "inside the image the server runs as: $whoami_in"
say "container smoke test passed"
