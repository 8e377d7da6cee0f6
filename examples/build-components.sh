#!/usr/bin/env bash
# Builds the interpreted-language placer examples from source into target/examples/:
#
#   examples/build-components.sh [python] [js]      (both when no language is named)
#
#   python  examples/placer-python -> target/examples/placer_spread_python.wasm (componentize-py)
#   js      examples/placer-js     -> target/examples/placer_spread_js.wasm     (jco, QuickJS)
#
# Each toolchain is installed at its pinned version into target/examples/toolchains/ (a
# virtualenv from examples/placer-python/requirements.txt; `npm ci` from
# examples/placer-js/package-lock.json) and reused while its pins are unchanged. A
# component is rebuilt only when its sources, wit/, its pins or this script changed: the
# hash of those is kept beside the .wasm. The example's unit tests run before each build.
#
# Needs python3 (3.11+, with venv and pip) for Python and node (20+) with npm for
# JavaScript, and network access to PyPI and the npm registry the first time. Prints the
# path of each component it built or reused; exits non-zero, saying why, when it cannot.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/target/examples"
tools="$out/toolchains"
mkdir -p "$tools"

fail() {
    echo "build-components: $*" >&2
    exit 1
}

# One build at a time: concurrent callers wait here, then reuse what the first one built.
exec 9>"$out/.lock"
flock 9

# The hash of the given files and of every file under the given directories (caches left
# out, and documentation: a README edit rebuilds nothing), by path relative to the
# repository root.
inputs_hash() {
    (
        cd "$root"
        find "$@" -type f \
            -not -path '*/__pycache__/*' -not -path '*/node_modules/*' -not -path '*/.venv/*' \
            -not -name '*.wasm' -not -name '*.md' -print0 |
            sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
    )
}

# Whether $1 holds exactly the hash $2.
is_current() {
    [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]
}

build_python() {
    local src="examples/placer-python" wasm="$out/placer_spread_python.wasm"
    local venv="$tools/python" pins
    pins=$(inputs_hash "$src/requirements.txt")
    if ! is_current "$venv/.pins" "$pins" || ! [ -x "$venv/bin/componentize-py" ]; then
        command -v python3 >/dev/null ||
            fail "python3 is not installed; the Python example needs Python 3.11 or later"
        python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
            fail "the Python example needs Python 3.11 or later, found $(python3 --version 2>&1)"
        rm -rf "$venv"
        echo "build-components: installing componentize-py into $venv" >&2
        python3 -m venv "$venv" ||
            fail "python3 -m venv failed (on Debian and Ubuntu: apt-get install python3-venv)"
        "$venv/bin/pip" install --quiet --disable-pip-version-check \
            -r "$root/$src/requirements.txt" ||
            fail "pip could not install $src/requirements.txt into $venv (is PyPI reachable?)"
        echo "$pins" >"$venv/.pins"
    fi

    local hash
    hash=$(inputs_hash "$src" wit examples/build-components.sh)
    if is_current "$wasm.inputs" "$hash" && [ -f "$wasm" ]; then
        echo "$wasm"
        return
    fi
    echo "build-components: testing and building $src" >&2
    (cd "$root/$src" && PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" -m unittest -q test_spread) ||
        fail "the unit tests of $src failed"
    rm -f "$wasm" "$wasm.inputs"
    (cd "$root/$src" && PYTHONDONTWRITEBYTECODE=1 "$venv/bin/componentize-py" \
        -d "$root/wit/policy.wit" -w placer componentize app -o "$wasm.tmp" >&2) ||
        fail "componentize-py could not build $src"
    mv "$wasm.tmp" "$wasm"
    echo "$hash" >"$wasm.inputs"
    echo "$wasm"
}

build_js() {
    local src="examples/placer-js" wasm="$out/placer_spread_js.wasm"
    local modules="$tools/js" pins
    pins=$(inputs_hash "$src/package.json" "$src/package-lock.json")
    if ! is_current "$modules/.pins" "$pins" || ! [ -x "$modules/node_modules/.bin/jco" ]; then
        command -v node >/dev/null ||
            fail "node is not installed; the JavaScript example needs Node.js 20 or later"
        node -e 'process.exit(Number(process.versions.node.split(".")[0]) < 20 ? 1 : 0)' ||
            fail "the JavaScript example needs Node.js 20 or later, found $(node --version)"
        command -v npm >/dev/null ||
            fail "npm is not installed (on Debian and Ubuntu: apt-get install npm)"
        rm -rf "$modules"
        mkdir -p "$modules"
        cp "$root/$src/package.json" "$root/$src/package-lock.json" "$modules/"
        echo "build-components: installing jco into $modules" >&2
        (cd "$modules" && npm ci --include=dev --no-audit --no-fund --loglevel=error >&2) ||
            fail "npm ci could not install $src/package-lock.json into $modules (is the npm registry reachable?)"
        echo "$pins" >"$modules/.pins"
    fi

    local hash
    hash=$(inputs_hash "$src" wit examples/build-components.sh)
    if is_current "$wasm.inputs" "$hash" && [ -f "$wasm" ]; then
        echo "$wasm"
        return
    fi
    echo "build-components: testing and building $src" >&2
    (cd "$root/$src" && node --test spread.test.js >/dev/null) ||
        fail "the unit tests of $src failed (node --test $src/spread.test.js)"
    rm -f "$wasm" "$wasm.inputs"
    (cd "$root/$src" && "$modules/node_modules/.bin/jco" componentize app.js \
        --wit "$root/wit/policy.wit" --world-name placer \
        --backend quickjs --backend-qjs-disable-async --out "$wasm.tmp" >&2) ||
        fail "jco componentize could not build $src"
    mv "$wasm.tmp" "$wasm"
    echo "$hash" >"$wasm.inputs"
    echo "$wasm"
}

languages=("$@")
[ ${#languages[@]} -gt 0 ] || languages=(python js)
for language in "${languages[@]}"; do
    case "$language" in
        python) build_python ;;
        js) build_js ;;
        *) fail "unknown language '$language' (python or js)" ;;
    esac
done
