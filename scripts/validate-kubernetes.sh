#!/usr/bin/env bash
# Validates every Kubernetes manifest under examples/ (or the directory given) against the API schemas of each Kubernetes version below,
# offline: kubernetes-validate (from PyPI, into a virtual environment under .dev/, ignored by git) ships the
# schemas, so nothing here needs a cluster. --strict fails a field the API does not have (a misspelt key is
# otherwise dropped by the API server without a word). Exits 1 if any resource of any file fails, or is not
# validated at all (a kind whose schema the package lacks is only a warning to kubernetes-validate).
# Used by CI (.ci/run); docs/kubernetes.md says what else checks the examples.
set -euo pipefail
cd "$(dirname "$0")/.."

# The package's version decides which Kubernetes versions it has schemas for (1.37.0: 1.25 to 1.37); pinned, so
# that a new release cannot change what passes. 1.34: the oldest Kubernetes the examples are for
# (resource.k8s.io/v1, two-pods-shared-claim.yaml); 1.37: the newest the package knows.
package=kubernetes-validate==1.37.0
versions=(1.34 1.37)
venv=.dev/kubernetes-validate
validate=$venv/bin/kubernetes-validate

if [ "$("$validate" --version 2>/dev/null || true)" != "${package#*==}" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "$package"
fi

shopt -s nullglob
dir=${1:-examples}
files=("$dir"/*.yaml "$dir"/*.yml)
if [ ${#files[@]} -eq 0 ]; then echo "validate-kubernetes: no manifest under $dir/"; exit 1; fi

failed=0
for version in "${versions[@]}"; do
  set +e
  out=$("$validate" --strict --kubernetes-version "$version" "${files[@]}" 2>&1); rc=$?
  set -e
  echo "$out"
  bad=0
  # Every line must say a resource passed: ERROR (invalid), WARN (no schema: not validated), FATAL (a version
  # the package does not know) all fail, whatever the exit status says.
  if [ $rc -ne 0 ] || grep -qv '^INFO .* passed for resource ' <<<"$out"; then bad=1; fi
  for file in "${files[@]}"; do
    if ! grep -q "^INFO $file passed " <<<"$out"; then
      echo "validate-kubernetes: $file: no resource of it passed against Kubernetes $version"
      bad=1
    fi
  done
  if [ $bad -eq 0 ]; then
    echo "validate-kubernetes: $(grep -c '^INFO ' <<<"$out") resources of ${#files[@]} files passed" \
      "against Kubernetes $version (--strict)"
  else
    echo "validate-kubernetes: FAILED against Kubernetes $version (kubernetes-validate exited $rc)"
    failed=1
  fi
done
exit $failed
