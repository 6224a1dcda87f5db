"""The contract's old path, ``workers.contract``, still imports (deprecated) as the very modules of
``orchestrator_contract``: users' code written against it and state pickled before the move keep working."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, pickle, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import workers.contract.rest.jobs as old_rest
    from workers.contract import states as old_states
import orchestrator_contract.rest.jobs, orchestrator_contract.states
# a class pickled under its old module path (protocol 0's GLOBAL opcode names module and class)
unpickled = pickle.loads(b"cworkers.contract.states\\nJobState\\n.")
print(json.dumps({
    "same_modules": old_rest is orchestrator_contract.rest.jobs and old_states is orchestrator_contract.states,
    "unpickled_is_the_class": unpickled is orchestrator_contract.states.JobState,
    "warnings": [(w.category.__name__, str(w.message)) for w in caught],
}))
"""


def test_the_old_path_is_the_new_modules_with_a_deprecation_warning():
    # a fresh interpreter: in this one another test may have imported the alias already (it warns once)
    ran = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout)
    assert seen["same_modules"] and seen["unpickled_is_the_class"]
    assert [category for category, _ in seen["warnings"]] == ["DeprecationWarning"]
    assert "import orchestrator_contract instead" in seen["warnings"][0][1]
