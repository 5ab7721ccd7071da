"""scripts/mutation_audit.py plants each of its mutants by replacing a text that must occur
once in its file: one that no longer applies after a refactor is an audit that silently
shrank. Applying them is cheap (no build); running them is hours, done by hand."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "mutation_audit.py"


def _audit_module():
    spec = importlib.util.spec_from_file_location("mutation_audit", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


AUDIT = _audit_module()


@pytest.mark.parametrize("mutant", AUDIT.MUTANTS, ids=[m.name for m in AUDIT.MUTANTS])
def test_every_mutant_still_applies(mutant):
    originals, mutated = AUDIT.mutate(mutant)  # raises naming the text that is gone
    for file, text in mutated.items():
        assert text != originals[file], f"{mutant.name} changes nothing in {file}"


def test_every_behaviour_test_file_exists():
    root = SCRIPT.parent.parent
    for selection in AUDIT.BEHAVIOUR + AUDIT.CALL_LOGS:
        assert (root / selection.split("::")[0]).is_file(), selection
