#!/usr/bin/env bash
# The layer contracts of pyproject.toml ([tool.importlinter]) checked on an installed copy of the
# package: policies/, drafters/ and verifiers/ are mapped into specpolicy.* by package-dir, which
# an editable install serves through an import hook that import-linter cannot walk.
set -euo pipefail
cd "$(dirname "$0")/.."
target="$(mktemp -d)"
trap 'rm -rf "$target"' EXIT
pip install --quiet --no-deps --no-build-isolation --target "$target" . >/dev/null
rm -rf build
(cd "$target" && PYTHONPATH="$target" lint-imports "$OLDPWD/pyproject.toml")
