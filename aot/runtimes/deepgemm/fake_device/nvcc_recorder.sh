#!/bin/bash
# Build-side stand-in nvcc for enumerating DeepGEMM keys on a GPU-less box: answers --version with
# the real nvcc's text (it is part of DeepGEMM's cache key), records each compile request DeepGEMM
# makes (argv; kernel.cu stays in the entry) and writes a placeholder cubin so DeepGEMM goes on.
if [ "$1" = "--version" ]; then exec "$NOJIT_DG_REAL_NVCC" --version; fi
out=""; prev=""
for a in "$@"; do { [ "$prev" = "-o" ] || [ "$prev" = "--output-file" ]; } && out=$a; prev=$a; done
printf '{"ev":"nvcc","argv":"%s"}\n' "$*" >> "$NOJIT_DG_LOG"
printf 'placeholder' > "$out"
