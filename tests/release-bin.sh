#!/usr/bin/env bash
# Prints the path of a release's `mcpfleet` binary, built from the commit releases.toml records for it, in a cache
# that outlives the checkout (so that CI and later runs on one machine build it once):
#
#   tests/release-bin.sh            # the newest release
#   tests/release-bin.sh 0.1.0      # a given one
#   MCPFLEET_RELEASE_CACHE=/some/dir tests/release-bin.sh   # another cache (default ~/.cache/mcpfleet/releases)
#
# A miss takes the release's sources out of git (`git archive`: the checkout needs the commit, so a shallow clone
# must fetch it first), builds `mcpfleet` (debug, its own Cargo.lock, `--locked`) in a target directory of its own
# under the cache, keeps the binary and removes the rest. A cold build costs about as much as this tree's own debug
# build (docs/TESTING.md, "Mixed versions"). Progress goes to stderr; only the path goes to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-}"
commit="$(python3 - "$version" <<'PY'
import sys, tomllib
releases = tomllib.load(open("releases.toml", "rb"))["release"]
want = sys.argv[1]
found = [r for r in releases if r["version"] == want] if want else releases[-1:]
if not found:
    sys.exit(f"release-bin: no release {want!r} in releases.toml (there are {', '.join(r['version'] for r in releases)})")
print(found[0]["version"], found[0]["commit"])
PY
)"
read -r version commit <<<"$commit"
cache="${MCPFLEET_RELEASE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mcpfleet/releases}/$version-${commit:0:12}"
if [[ -x "$cache/mcpfleet" ]]; then
  echo "$cache/mcpfleet"
  exit 0
fi
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
  echo "release-bin: commit $commit of release $version is not in this clone (git fetch --unshallow, or fetch it)" >&2
  exit 1
fi
echo "release-bin: building mcpfleet $version from ${commit:0:12} into $cache (once per machine)" >&2
work="$cache.building.$$"
rm -rf "$work"
mkdir -p "$work/src"
trap 'rm -rf "$work"' EXIT
git archive "$commit" | tar -x -C "$work/src"
start=$SECONDS
(cd "$work/src" && CARGO_TARGET_DIR="$work/target" cargo build -q --locked -p mcpfleet --bin mcpfleet >&2)
# The binary says which release it is (its --version is the workspace version it was built with).
"$work/target/debug/mcpfleet" --version | grep -qF " $version" ||
  { echo "release-bin: the binary built from ${commit:0:12} is not $version: $("$work/target/debug/mcpfleet" --version)" >&2; exit 1; }
mkdir -p "$cache"
cp "$work/target/debug/mcpfleet" "$cache/mcpfleet.tmp"
mv "$cache/mcpfleet.tmp" "$cache/mcpfleet"
echo "release-bin: built in $(( SECONDS - start )) s" >&2
echo "$cache/mcpfleet"
