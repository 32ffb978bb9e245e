#!/usr/bin/env bash
# The working tree a device call copies: tracked files plus untracked files git does not ignore, at most
# 64 MiB. The full tree is larger (bundle assets, result data, images), so for the call it is slimmed.
#
#   scripts/gpu_tree.sh size      MiB that would travel (tracked + untracked-not-ignored files on disk)
#   scripts/gpu_tree.sh slim      untrack (git rm --cached) and ignore (the repository's info/exclude) what the
#                                 GPU run does not read; no file on disk is touched; fails above LIMIT_MIB
#   scripts/gpu_tree.sh restore   put the index and the exclude file back exactly as `slim` found them
#
# What stays: the package and its emoji / emoji-t2i bundles (target, draft, drafter, VQ, tokenizer), scripts,
# tests, docs but for the result data and images; of docs/results the t2i prompt ids and texts
# (scripts/gpu_scale.py reads the ids) and any gpu-scale-*.json (for --resume).
# What goes: docs/results (but the above), docs/img, and the emoji bundle's MAR, continuous and classifier
# parts (no GPU section loads them). Do not commit while slim: the index then holds those files' removal.
set -euo pipefail

LIMIT_MIB=${GPU_TREE_LIMIT_MIB:-60}
cd "$(dirname "$0")/.."
GIT_INDEX=$(git rev-parse --path-format=absolute --git-path index)
EXCLUDE=$(git rev-parse --path-format=absolute --git-path info/exclude)
SAVED=$(git rev-parse --path-format=absolute --git-path specvis-gpu-tree)  # the saved index, exclude file, HEAD

DROP=(docs/results docs/img specvis/assets/emoji/mar_target specvis/assets/emoji/mar_draft
      specvis/assets/emoji/continuous_target specvis/assets/emoji/continuous_draft specvis/assets/emoji/classifier)
KEEP_RE='^docs/results/(data/emoji-t2i-prompt-ids\.json|data/emoji-t2i-prompts\.txt|gpu-scale-[^/]*\.json)$'

travelling_mib() {
    # every tracked or untracked-not-ignored path that exists on disk (a symbolic link travels as itself)
    git ls-files -z --cached --others --exclude-standard | sort -zu |
        python3 -c 'import os, sys
paths = [p for p in sys.stdin.buffer.read().split(b"\0") if p]
total = sum(os.lstat(p).st_size for p in paths if os.path.lexists(p))
print(f"{total / 2**20:.1f}")'
}

ignore_line() {  # a path as an anchored gitignore pattern, its special characters escaped
    printf '/%s\n' "$(printf '%s' "$1" | sed -e 's/[][*?\\]/\\&/g' -e 's/^[!#]/\\&/')"
}

case "${1:-}" in
size)
    travelling_mib
    ;;
slim)
    if [ -e "$SAVED" ]; then
        echo "gpu_tree.sh slim: already slim ($SAVED exists): run 'scripts/gpu_tree.sh restore' first" >&2
        exit 2
    fi
    mkdir -p "$SAVED" "$(dirname "$EXCLUDE")"
    cp -p "$GIT_INDEX" "$SAVED/index"
    if [ -e "$EXCLUDE" ]; then cp -p "$EXCLUDE" "$SAVED/exclude"; fi
    git rev-parse HEAD > "$SAVED/HEAD"
    mapfile -d '' dropped < <(git ls-files -z -- "${DROP[@]}" | grep -zEv "$KEEP_RE" || true)
    if [ "${#dropped[@]}" -gt 0 ]; then
        printf '%s\0' "${dropped[@]}" | git --literal-pathspecs rm -q --cached --pathspec-from-file=- --pathspec-file-nul
        {
            echo "# scripts/gpu_tree.sh slim: untracked for a device call; 'scripts/gpu_tree.sh restore' undoes this"
            for p in "${dropped[@]}"; do ignore_line "$p"; done
        } >> "$EXCLUDE"
    fi
    mib=$(travelling_mib)
    echo "gpu_tree.sh slim: ${#dropped[@]} files untracked and ignored (kept on disk); ${mib} MiB would travel"
    if python3 -c "import sys; sys.exit(0 if float('$mib') <= $LIMIT_MIB else 1)"; then
        exit 0
    fi
    echo "gpu_tree.sh slim: ${mib} MiB is above ${LIMIT_MIB} MiB: untrack more, or carry less" >&2
    exit 1
    ;;
restore)
    if [ ! -e "$SAVED/index" ]; then
        echo "gpu_tree.sh restore: nothing to restore (no $SAVED/index: not slim)" >&2
        exit 2
    fi
    if [ "$(git rev-parse HEAD)" != "$(cat "$SAVED/HEAD")" ]; then
        echo "gpu_tree.sh restore: HEAD moved since slim; the saved index is in $SAVED/index: check a commit made" \
             "while slim for removed files, then restore by hand (cp $SAVED/index $GIT_INDEX)" >&2
        exit 1
    fi
    cp -p "$SAVED/index" "$GIT_INDEX"
    if [ -e "$SAVED/exclude" ]; then cp -p "$SAVED/exclude" "$EXCLUDE"; else rm -f "$EXCLUDE"; fi
    rm -rf "$SAVED"
    echo "gpu_tree.sh restore: index and $(basename "$EXCLUDE") back as before slim; $(travelling_mib) MiB would travel"
    ;;
*)
    echo "usage: scripts/gpu_tree.sh size|slim|restore (got '${1:-}')" >&2
    exit 2
    ;;
esac
