"""INV-GATHER-EXTENSIONS on the three ways a gather can treat extension fields.

Gathering them passes; refusing them with PRE-EXTENSION-SUPPORTED before any all-gather of the
gather passes (CL-EXTENSION-FIELDS); raising anything else, or returning without them, fails.
The checker is called on each rank's record directly, so this holds whatever the harness does with
a raised error.
"""

import pytest

from shardspec.conformance.broken import cases
from shardspec.conformance.broken.extensions import DropsExtensionField
from shardspec.conformance.judge.checks.extensions import check_gather_extensions
from shardspec.conformance.replay import step_records
from shardspec.reference import ReferenceSharder
from shardspec.spec.errors import PreconditionError


class RefusesExtensionFields(ReferenceSharder):
    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        if kwargs.get("extension_fields"):
            raise PreconditionError("PRE-EXTENSION-SUPPORTED", "extension_fields", "not supported", rank=self.rank)
        return super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)


class RaisesAnonymously(ReferenceSharder):
    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        raise TypeError("unexpected keyword argument 'extension_fields'")


def _violations(factory) -> list[list[str]]:
    return [[v.message for v in check_gather_extensions(r)] for r in step_records(cases.EXTENSIONS, factory, "cpu")]


@pytest.mark.parametrize("factory", [ReferenceSharder, RefusesExtensionFields], ids=["gathers", "refuses"])
def test_gathering_or_refusing_passes_on_every_rank(factory):
    assert _violations(factory) == [[]] * cases.EXTENSIONS.tp_size


@pytest.mark.parametrize(
    ("factory", "words"),
    [(RaisesAnonymously, "TypeError"), (DropsExtensionField, "expected the declared fields")],
    ids=["raises-another-error", "drops-a-field"],
)
def test_anything_else_fails_on_every_rank(factory, words):
    per_rank = _violations(factory)
    assert all(len(messages) == 1 and words in messages[0] for messages in per_rank), per_rank
