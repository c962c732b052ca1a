"""Read a sealed bundle with polars and with DuckDB, the way a user would (see
specs/bundle.md, "Reading a bundle"), and print what each found as JSON on stdout
for harness/tests/it/surfaces.rs to compare with the values it planted.

usage: python cross_read.py BUNDLE_DIR
"""
import base64
import json
import sys

import duckdb
import polars as pl
import pyarrow as pa


def with_polars(b):
    s = pl.read_parquet(f"{b}/samples.parquet")
    p = pl.read_parquet(f"{b}/phases.parquet")
    # Field metadata (unit, window, source) lives in the embedded Arrow schema;
    # polars hands it over as file metadata, pyarrow decodes the IPC schema.
    meta = pl.read_parquet_metadata(f"{b}/samples.parquet")
    schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(meta["ARROW:schema"])))
    unit = lambda col: schema.field(col).metadata[b"unit"].decode()
    return {
        "samples": s.height,
        "phases": p.height,
        "steps": p.filter(pl.col("name") == "denoise.step").height,
        "denoise_s": p.filter(pl.col("name") == "denoise")["duration_s"][0],
        "max_rss": float(s["rss_bytes"].max()),
        "util_non_null": s["gpu_util_pct"].drop_nulls().len(),
        "power_non_null": s["gpu_power_mw"].drop_nulls().len(),
        "rss_unit": unit("rss_bytes"),
        "power_unit": unit("gpu_power_mw"),
    }


def with_duckdb(b):
    con = duckdb.connect()
    one = lambda q: con.execute(q).fetchone()[0]
    sp, pp = f"'{b}/samples.parquet'", f"'{b}/phases.parquet'"
    kv = con.execute(
        f"select decode(value) from parquet_kv_metadata({sp}) "
        "where decode(key) = 'evidence.table'").fetchone()
    return {
        "samples": one(f"select count(*) from {sp}"),
        "phases": one(f"select count(*) from {pp}"),
        "steps": one(f"select count(*) from {pp} where name = 'denoise.step'"),
        "denoise_s": one(f"select duration_s from {pp} where name = 'denoise'"),
        "max_rss": float(one(f"select max(rss_bytes) from {sp}")),
        "util_non_null": one(f"select count(gpu_util_pct) from {sp}"),
        "power_non_null": one(f"select count(gpu_power_mw) from {sp}"),
        "table_kv": kv[0] if kv else None,
    }


if __name__ == "__main__":
    b = sys.argv[1]
    json.dump({"polars": with_polars(b), "duckdb": with_duckdb(b)}, sys.stdout)
