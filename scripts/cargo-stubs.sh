#!/bin/sh
# Writes a placeholder source at the path of every target Cargo.toml declares (the library,
# the binaries, and each [[bench]], [[test]], [[example]] and [[bin]] section), so that the
# dependencies can be built before the sources are copied in: Cargo refuses a manifest whose
# declared targets are missing. Used by the Dockerfile's dependency stage; CI runs that stage.
set -eu
manifest=${1:-Cargo.toml}
awk '
    function emit() {
        if (kind == "") return
        if (path == "") path = (kind == "lib") ? "src/lib.rs" : default_dir[kind] name ".rs"
        print kind, path
        kind = ""; name = ""; path = ""
    }
    BEGIN {
        default_dir["bench"] = "benches/"; default_dir["test"] = "tests/"
        default_dir["example"] = "examples/"; default_dir["bin"] = "src/bin/"
    }
    /^[[:space:]]*\[/ {
        emit()
        if ($0 ~ /^[[:space:]]*\[\[(bench|test|example|bin)\]\]/) {
            kind = $0; gsub(/[][[:space:]]/, "", kind)
        } else if ($0 ~ /^[[:space:]]*\[lib\]/) {
            kind = "lib"
        }
        next
    }
    kind != "" && /^[[:space:]]*(name|path)[[:space:]]*=/ {
        key = $0; sub(/[[:space:]]*=.*/, "", key); gsub(/[[:space:]]/, "", key)
        value = $0; sub(/^[^=]*=[[:space:]]*"/, "", value); sub(/".*/, "", value)
        if (key == "name") name = value; else path = value
    }
    END { emit(); print "lib src/lib.rs"; print "bin src/main.rs" }
' "$manifest" | sort -u | while read -r kind path; do
    mkdir -p "$(dirname "$path")"
    if [ "$kind" = lib ]; then : > "$path"; else echo 'fn main() {}' > "$path"; fi
    echo "$path"
done
