"""The check made before re-recording tests/planner/plans_before_scale.json for the AllReduce overlap
(issue 28 item 1): every instance whose plans changed changed because of that term and nothing else.

    PYTHONPATH=. python -m tests.planner.check_rerecord            # check, list the changed plans
    PYTHONPATH=. python -m tests.planner.check_rerecord --write    # ... and re-record (what was run)

1. overlap off (one bucket: exposed = T_a, the term before): every instance equals the recorded file;
2. overlap on: each changed strategy plan has a replicated stage (old or new plan), and its round
   latency is no higher than before (the new term only lowers T_a).
Run against the file as it was before the re-recording, step 1 passed and step 2 listed 148 plans;
against the re-recorded file step 1 lists the instances the overlap moved, as it should."""
import json, math, sys
import hppctl.planner.cost as cost
import hppctl.planner.vector_alloc as va
from hppctl.planner import cost_model, make_plan
from hppctl.planner.cost import StageChoice
from tests.planner.plan_fixture import FIXTURE, instances, plans_of

RECORDED = json.loads(FIXTURE.read_text())["instances"]
insts = instances()
saved = cost.ALLREDUCE_BUCKET_BYTES
cost.ALLREDUCE_BUCKET_BYTES = va.ALLREDUCE_BUCKET_BYTES = math.inf
bad = [i.name for i in insts if plans_of(i) != RECORDED[i.name]]
print("overlap off: instances differing from the recorded file:", bad)
cost.ALLREDUCE_BUCKET_BYTES = va.ALLREDUCE_BUCKET_BYTES = saved
changed = 0
new_doc = {}
for inst in insts:
    now = plans_of(inst)
    new_doc[inst.name] = now
    old = RECORDED[inst.name]
    if now == old:
        continue
    cm = cost_model(inst.profile, inst.request)
    for k in now:
        if now[k] == old[k]:
            continue
        changed += 1
        def replicated(p):
            if p is None: return False
            st = p["stages"]
            return any(len(s["devices"] if isinstance(s, dict) else s[2]) > 1 for s in st)
        def stages_of(p):
            out = []
            for s in p["stages"]:
                if isinstance(s, dict):
                    if s.get("backward_layers"): return None
                    out.append(StageChoice(s["layers"][0], s["layers"][1], tuple(cm.names.index(d) for d in s["devices"]), tuple(s["samples"])))
                else:
                    out.append(StageChoice(s[0], s[1], tuple(s[2]), tuple(s[3])))
            return out
        lat_key = "round_latency_s" if "round_latency_s" in (now[k] or old[k] or {}) else "latency"
        new_lat = float.fromhex(now[k][lat_key]) if now[k] else None
        old_lat = float.fromhex(old[k][lat_key]) if old[k] else None
        old_st = stages_of(old[k]) if old[k] else None
        old_under_new = cm.evaluate(old_st).round_latency_s if old_st and k != "paper-dp-unpruned" else None
        same_stages = old[k] and now[k] and old[k]["stages"] == now[k]["stages"]
        print(f"{inst.name:22s} {k:18s} same stages={bool(same_stages)!s:5s} replicated old/new={replicated(old[k])}/{replicated(now[k])} "
              f"old={old_lat} new={new_lat} old-stages-under-new={old_under_new}")
        assert replicated(old[k]) or replicated(now[k]), (inst.name, k)
        assert new_lat <= old_lat * (1 + 1e-12), (inst.name, k)
print("changed strategy plans:", changed)
if "--write" in sys.argv:
    FIXTURE.write_text(json.dumps({"instances": new_doc}, indent=1, sort_keys=True) + "\n")
    print("wrote", FIXTURE)
