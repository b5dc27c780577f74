"""Stage `register`: every version stage `publish` wrote is registered in MLflow's model registry
(builder/storage/mlflow_registry.py: artifacts, metrics, host and variant tags), when the build was
asked to (``build --register``). The registry was checked to answer before the build started; if
registering fails now, the versions stay published and the error says how to register them by hand.

Usage::

    triton-builder build examples/digits/spec.yaml --register --registry http://127.0.0.1:5000 --alias prod
"""

from __future__ import annotations

from builder.core.errors import BuilderError
from builder.stages.base import BuildContext, StageResult
from builder.storage.mlflow_registry import register_version

STAGE = "register"


def run(ctx: BuildContext) -> StageResult:
    registry = ctx.options.registry
    if not registry:
        return StageResult.skipped(STAGE, "not asked to register (build --register)")
    registered = []
    for item in ctx.published:
        folder = ctx.options.repository / item["name"]
        alias = ctx.options.registry_alias if item["name"] == ctx.spec.name else None
        try:
            done = register_version(registry, folder, version=item["version"], alias=alias)
        except BuilderError as err:  # the server went away or refused: the versions stay published
            return StageResult.fail(
                STAGE, f"{item['name']} version {item['version']} is published but not registered: {err}; "
                       f"register it with `triton-builder register {folder} --version {item['version']} "
                       f"--registry {registry}`", registered=registered)
        registered.append({"name": item["name"], "version": item["version"], "uri": done["uri"],
                           "run_id": done["run_id"], **({"alias": alias} if alias else {})})
        ctx.progress(f"  {'already registered' if done.get('already') else 'registered'} {item['name']} version "
                     f"{item['version']} as {done['uri']}" + (f" (alias {alias})" if alias else ""))
        if done.get("note"):
            ctx.progress(f"  note: {done['note']}")
    uris = ", ".join(r["uri"] for r in registered)
    return StageResult.ok(STAGE, f"registered in {registry}: {uris}", registered=registered)
