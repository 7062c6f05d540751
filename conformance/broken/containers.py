"""Right values in the wrong container type. One defect each.

The data model says list[str]; a tuple compares unequal to a list in Python,
breaks callers that append, and does not survive a JSON round trip as one.
"""

from __future__ import annotations

from dataclasses import replace

from shardspec.conformance.broken.support import MisreportingSharder


class ReqIdsAsTuple(MisreportingSharder):
    """INV-LOCAL-REQS: local_batch.req_ids is a tuple instead of a list of str."""

    def corrupt(self, batch, result):
        return self.corrupt_local_batch(result, req_ids=tuple(result.local_batch.req_ids))


class GrammarIdsAsTuple(MisreportingSharder):
    """INV-LOCAL-GRAMMAR: the local grammar output lists its request ids in a tuple instead of a list of str."""

    def corrupt(self, batch, result):
        grammar = result.local_grammar_output
        if grammar is None:
            return result
        ids = tuple(grammar.structured_output_request_ids)
        return result._replace(local_grammar_output=replace(grammar, structured_output_request_ids=ids))
