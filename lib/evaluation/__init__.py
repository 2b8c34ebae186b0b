"""The evaluation: Table 4, ablations, transfer, the targets, the injection
suite and the benchmarks -- the top of the stack, above training.

- :mod:`lib.evaluation.protocol` -- :func:`evaluate`, what ``gpuhive evaluate``
  runs (task set, idle and busy states, every policy through the runtime);
- :mod:`lib.evaluation.report` -- rows, Table 4 and the report's text,
  Markdown and JSON forms;
- :mod:`lib.evaluation.experiments` -- ablations and transfer;
- :mod:`lib.evaluation.targets` -- T1-T7, each PASS or FAIL with its value;
- :mod:`lib.evaluation.audit` -- the injection suite that scores the gates;
- :mod:`lib.evaluation.bench` -- every figure ``gpuhive bench`` prints.

How a single policy is scored (the metrics, the task sets, the evaluator and
decision latency) is one layer down, in :mod:`lib.scoring`, because training
uses it too.
"""

from lib.evaluation.protocol import evaluate
from lib.evaluation.report import LEARNED, EvalReport, Row, Target

__all__ = ["LEARNED", "EvalReport", "Row", "Target", "evaluate"]
