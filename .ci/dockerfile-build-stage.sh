#!/usr/bin/env bash
# Runs the Dockerfile's build stage without a Docker daemon, so the image's recipe cannot
# drift from the project: every WORKDIR, COPY and RUN of the stage, in order, in a scratch
# directory that stands in for the image's filesystem, with the build context as git sees it
# (tracked and untracked files, less the ignored ones; .dockerignore names the same).
#
# The RUN lines run as written. Only the release profile is lightened through Cargo's
# environment (no optimisation, no LTO), because the stage builds llmslo twice (instrumented,
# then with its profile) on top of CI's own builds: what is checked is that every step
# succeeds (the profile is written and used), not how fast the binary is.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
root=$repo/target/ci/docker-build
rm -rf "$root"
mkdir -p "$root"
# The stage's filesystem is gigabytes of build output: gone when the check ends, however.
trap 'rm -rf "$root"' EXIT
export CARGO_PROFILE_RELEASE_OPT_LEVEL=0 CARGO_PROFILE_RELEASE_LTO=false \
    CARGO_PROFILE_RELEASE_CODEGEN_UNITS=256 CARGO_PROFILE_RELEASE_DEBUG=false CARGO_INCREMENTAL=0
unset CARGO_TARGET_DIR

# The build stage's instructions, one per line (continuations joined, comments dropped).
instructions=$(awk '
    /^[[:space:]]*#/ || /^[[:space:]]*$/ { next }
    { line = (pending == "") ? $0 : pending " " $0 }
    /\\[[:space:]]*$/ { sub(/\\[[:space:]]*$/, "", line); pending = line; next }
    { pending = ""; print line }
' Dockerfile | awk '
    toupper($1) == "FROM" { stage = (tolower($0) ~ / as build$/); next }
    stage { print }
')
[ -n "$instructions" ] || { echo "Dockerfile: no stage named build" >&2; exit 1; }

workdir=/
inside() { case "$1" in /*) echo "$root$1" ;; *) echo "$root$workdir/$1" ;; esac; }
while IFS= read -r line; do
    instruction=$(echo "$line" | awk '{print toupper($1)}')
    arguments=${line#* }
    echo "-- $instruction $arguments"
    case "$instruction" in
        WORKDIR)
            workdir=$arguments
            mkdir -p "$root$workdir" ;;
        COPY)
            read -r -a parts <<< "$arguments"
            destination=${parts[-1]}
            sources=("${parts[@]:0:${#parts[@]}-1}")
            target=$(inside "$destination")
            if [ "${sources[*]}" = "." ]; then
                mkdir -p "$target"
                git ls-files -z --cached --others --exclude-standard \
                    | xargs -0 -I{} sh -c '[ -e "{}" ] && cp --parents -p "{}" "$0" || true' "$target"
            elif [ ${#sources[@]} -gt 1 ] || [ "${destination%/}" != "$destination" ]; then
                mkdir -p "$target"
                cp -p "${sources[@]}" "$target/"
            else
                mkdir -p "$(dirname "$target")"
                cp -p "${sources[0]}" "$target"
            fi ;;
        RUN)
            (cd "$root$workdir" && PATH="$root/usr/local/bin:$PATH" sh -c "$arguments") ;;
        LABEL | USER | EXPOSE | ENTRYPOINT | CMD) ;;
        *)
            echo "Dockerfile: $instruction is not something this check knows how to run" >&2
            exit 1 ;;
    esac
done <<< "$instructions"
binary=$root/src/target/release/llmslo
"$binary" --version
echo "the Dockerfile's build stage built llmslo (its scratch filesystem is removed)"
