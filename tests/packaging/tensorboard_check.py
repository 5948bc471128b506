"""tensorboard_check.py RUN_DIR: reads RUN_DIR/tb with TensorBoard's own EventAccumulator
and checks every scalar against what lockstep-train logged elsewhere:
  train/loss            == rank 0's metrics/loss-rank-0.csv at the same step, exactly: the
                           loss is a float32, the CSV's 9 significant digits give it back,
                           and TensorBoard stores float32
  train/lr              the CSV's lr (a double printed with 9 digits) within one float32
                           ulp (relative 2**-23): rounding to 9 digits, then to float32, can
                           land one ulp from float32 of the exact double
  train/samples_per_s   one per step, positive
  eval/<name>           == eval.json's metrics[name] (float32) at the last step
Prints the tags, their counts and the largest difference; exits 1 on any mismatch."""
import csv
import glob
import json
import os
import struct
import sys

from tensorboard.backend.event_processing import event_accumulator


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def main(run):
    files = glob.glob(os.path.join(run, "tb", "events.out.tfevents.*"))
    if len(files) != 1:
        sys.exit("expected one event file under %s/tb, found %d" % (run, len(files)))
    acc = event_accumulator.EventAccumulator(files[0], size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    print("tags:", ", ".join("%s (%d)" % (t, len(acc.Scalars(t))) for t in sorted(tags)))

    with open(os.path.join(run, "metrics", "loss-rank-0.csv")) as f:
        rows = {int(r["step"]): r for r in csv.DictReader(f)}
    errors, worst = [], {}
    for tag, col, rel_tol in (("train/loss", "loss", 0.0), ("train/lr", "lr", 2.0**-23)):
        events = acc.Scalars(tag) if tag in tags else []
        if len(events) != len(rows):
            errors.append("%s: %d events for %d logged steps" % (tag, len(events), len(rows)))
        worst[tag] = 0.0
        for e in events:
            if e.step not in rows:
                errors.append("%s: step %d was not logged in the CSV" % (tag, e.step))
                continue
            want = f32(float(rows[e.step][col]))
            diff = abs(e.value - want)
            worst[tag] = max(worst[tag], diff / abs(want) if want else diff)
            if diff > rel_tol * abs(want):
                errors.append("%s step %d: TensorBoard %r, CSV %r" % (tag, e.step, e.value, want))
    sps = acc.Scalars("train/samples_per_s") if "train/samples_per_s" in tags else []
    if len(sps) != len(rows) or any(not e.value > 0 for e in sps):
        errors.append("train/samples_per_s: %d values, all positive expected" % len(sps))

    with open(os.path.join(run, "eval.json")) as f:
        metrics = json.load(f)["metrics"]
    last = max(rows)
    evals = [t for t in tags if t.startswith("eval/")]
    if not evals:
        errors.append("no eval/* scalars")
    for tag in evals:
        name = tag[len("eval/"):]
        (e,) = acc.Scalars(tag)
        want = f32(float(metrics[name])) if isinstance(metrics.get(name), (int, float)) else None
        if e.step != last or want is None or e.value != want:
            errors.append("%s: TensorBoard %r at step %d, eval.json %r at step %d"
                          % (tag, e.value, e.step, metrics.get(name), last))
    print("compared %d train steps and %d eval scalars; max relative |TensorBoard - logged|: %s"
          % (len(rows), len(evals), ", ".join("%s %.3g" % kv for kv in sorted(worst.items()))))
    for e in errors[:20]:
        print("MISMATCH:", e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
