#!/usr/bin/env bash
# Builds the llama.cpp peer (CPU only) from the llama-cpp-python source package on PyPI, which vendors
# llama.cpp, so the peer version is pinned by one PyPI version and needs nothing but PyPI to fetch.
#
# usage: bench/peers/build_llamacpp.sh [DEST]   (DEST defaults to <repo>/.deps/llamacpp; git-ignored)
# env:   LLAMA_CPP_PYTHON_VERSION  sdist version to build (default below)
#        JOBS                      parallel build jobs (default: nproc)
#
# Produces, under DEST:
#   llama_cpp_python-<ver>/           the unpacked sdist (its llama_cpp/ is the ctypes layer that
#                                     bench/peers/llamacpp_greedy.py puts on sys.path)
#   bin/llama-bench, bin/llama-simple     (bin is a link to the build tree's build/bin)
#   bin/libllama.so, bin/libggml*.so      (LLAMA_CPP_LIB_PATH=DEST/bin)
# Re-running with everything built does nothing but print the paths.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEST="${1:-$REPO/.deps/llamacpp}"
JOBS="${JOBS:-$(nproc)}"

mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"
SRC="$DEST/llama_cpp_python-$VERSION"
LLAMA_SRC="$SRC/vendor/llama.cpp"
BUILD="$DEST/build"
STAMP="$DEST/.built-$VERSION"
BIN="$DEST/bin"

print_paths() {
  echo "llama-cpp-python $VERSION (llama.cpp $(cat "$DEST/llama_cpp_commit" 2>/dev/null || echo unknown))"
  echo "llama-bench:        $BIN/llama-bench"
  echo "llama-simple:       $BIN/llama-simple"
  echo "LLAMA_CPP_LIB_PATH: $BIN"
  echo "ctypes layer:       $SRC   (put on sys.path)"
  if [[ -f "$DEST/build_seconds" ]]; then
    echo "build time:         $(cat "$DEST/build_seconds") s"
  fi
}

if [[ -f "$STAMP" && -x "$BUILD/bin/llama-bench" && -f "$BUILD/bin/libllama.so" ]]; then
  ln -sfn build/bin "$BIN"
  echo "already built ($STAMP)"
  print_paths
  exit 0
fi

if [[ ! -d "$LLAMA_SRC" ]]; then
  SDIST="$DEST/llama_cpp_python-$VERSION.tar.gz"
  if [[ ! -f "$SDIST" ]]; then
    python3 -m pip download --no-deps --no-binary :all: \
      "llama-cpp-python==$VERSION" -d "$DEST"
  fi
  tar -xzf "$SDIST" -C "$DEST"
fi

# The sdist carries no git metadata; its CHANGELOG names the llama.cpp commit it vendors.
# Recorded so llama-bench's JSON (build_commit) and our result files say which llama.cpp ran.
COMMIT="$(awk -v v="## [$VERSION]" '
  $0 == v { inside = 1; next }
  inside && /^## \[/ { exit }
  inside && match($0, /llama\.cpp@[0-9a-f]+/) { print substr($0, RSTART + 10, RLENGTH - 10); exit }
' "$SRC/CHANGELOG.md")"
COMMIT="${COMMIT:-unknown}"
echo "$COMMIT" > "$DEST/llama_cpp_commit"

# DEST normally sits inside our own git checkout: without a ceiling, llama.cpp's build-info would
# ask git and record dinfer's commit as llama.cpp's.
export GIT_CEILING_DIRECTORIES="$SRC/vendor"

# A build tree configured from another version's sources cannot be reused.
rm -f "$DEST"/.built-*
if [[ -f "$BUILD/CMakeCache.txt" ]] &&
   ! grep -qxF "CMAKE_HOME_DIRECTORY:INTERNAL=$LLAMA_SRC" "$BUILD/CMakeCache.txt"; then
  rm -rf "$BUILD"
fi

START=$(date +%s)
cmake -S "$LLAMA_SRC" -B "$BUILD" \
  -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=ON \
  -DGGML_NATIVE=ON \
  -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=ON \
  -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_COMMIT="$COMMIT" \
  -DLLAMA_BUILD_NUMBER=0
# Only what the peer needs: the benchmark tool, a minimal generator, and the shared libraries.
cmake --build "$BUILD" -j "$JOBS" --target llama-bench llama-simple llama ggml
END=$(date +%s)
echo $((END - START)) > "$DEST/build_seconds"

ln -sfn build/bin "$BIN"
touch "$STAMP"
print_paths
