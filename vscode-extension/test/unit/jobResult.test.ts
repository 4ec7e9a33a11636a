import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { formatError, formatJobMessage, formatJobReport, formatSeconds, parseJobResult } from "../../src/jobResult";

const finished = {
  job_id: "7",
  status: "finished",
  step_time_s: 0.00123,
  max_abs_error: 2.384e-7,
  steps: 10,
  devices: 8,
  platform: "cpu",
  compile_s: 1.5,
  collectives: { all_gather: 2, all_reduce: 1, reduce_scatter: 0, all_to_all: 0, all_slice: 3 },
};

describe("parseJobResult", () => {
  it("accepts the documented result", () => {
    const r = parseJobResult(finished);
    assert.equal(r.job_id, "7");
    assert.equal(r.status, "finished");
    assert.equal(r.step_time_s, 0.00123);
    assert.equal(r.devices, 8);
    assert.deepEqual(r.collectives, finished.collectives);
  });

  it("accepts numeric job ids and null measurements of a failed job", () => {
    const r = parseJobResult({ job_id: 3, status: "failed", step_time_s: null, max_abs_error: null, error: "OOM" });
    assert.equal(r.job_id, "3");
    assert.equal(r.step_time_s, null);
    assert.equal(r.error, "OOM");
  });

  it("rejects malformed results with the field's name", () => {
    assert.throws(() => parseJobResult(null), /must be an object/);
    assert.throws(() => parseJobResult({ ...finished, job_id: "" }), /"job_id"/);
    assert.throws(() => parseJobResult({ ...finished, status: "done" }), /"status" must be one of finished\|failed\|cancelled/);
    assert.throws(() => parseJobResult({ ...finished, step_time_s: "1ms" }), /"step_time_s" must be a finite number/);
    assert.throws(() => parseJobResult({ ...finished, collectives: { all_gather: "2" } }), /"collectives"/);
    assert.throws(() => parseJobResult({ ...finished, step_time_s: null }), /a finished job needs "step_time_s"/);
  });
});

describe("formatting", () => {
  it("formats durations with units and three significant digits", () => {
    assert.equal(formatSeconds(0), "0 s");
    assert.equal(formatSeconds(8.5e-7), "850 ns");
    assert.equal(formatSeconds(1.234e-5), "12.3 µs");
    assert.equal(formatSeconds(0.00123), "1.23 ms");
    assert.equal(formatSeconds(0.0015), "1.5 ms");
    assert.equal(formatSeconds(0.25), "250 ms");
    assert.equal(formatSeconds(12), "12 s");
    assert.equal(formatSeconds(125), "2 min 5 s");
  });

  it("formats errors in scientific notation", () => {
    assert.equal(formatError(2.384e-7), "2.4e-7");
    assert.equal(formatError(0), "0");
  });

  it("writes one line for the message", () => {
    assert.equal(
      formatJobMessage(parseJobResult(finished), "bp_mp_z3.partir.py"),
      "PartIR job 7 (bp_mp_z3.partir.py) finished: 1.23 ms per step, max abs error 2.4e-7 (10 steps on 8 cpu devices)",
    );
    assert.equal(
      formatJobMessage(parseJobResult({ job_id: "8", status: "failed", step_time_s: null, max_abs_error: null, error: "XLA OOM" })),
      "PartIR job 8 failed: XLA OOM",
    );
    assert.equal(
      formatJobMessage(parseJobResult({ job_id: "9", status: "cancelled", step_time_s: null, max_abs_error: null })),
      "PartIR job 9 cancelled",
    );
  });

  it("writes a report for the output channel", () => {
    const lines = formatJobReport(
      parseJobResult({ ...finished, output: "step 1\nstep 2\n" }),
      "f.partir.py",
      new Date("2024-01-02T03:04:05.000Z"),
    );
    assert.deepEqual(lines, [
      "[2024-01-02T03:04:05.000Z] PartIR job 7 (f.partir.py) finished: 1.23 ms per step, max abs error 2.4e-7 (10 steps on 8 cpu devices)",
      "  step time      1.23 ms",
      "  max abs error  2.384e-7",
      "  compile        1.5 s",
      "  steps          10",
      "  devices        8 (cpu)",
      "  collectives    AG 2, AR 1, RS 0, A2A 0, all_slice 3",
      "  output:",
      "    step 1",
      "    step 2",
    ]);
  });
});
