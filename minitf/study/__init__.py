"""The study tools' internals, apart from the core a learner reads: the tracer and the backward walk of
``python -m minitf.trace`` (:mod:`minitf.study.tracer`, :mod:`minitf.study.walk`), the planted bugs of
``python -m minitf.gradcheck --bug`` (:mod:`minitf.study.bugs`), what the study commands share (the learner's
code run under guard, :mod:`minitf.study.tools`) and the inspection page's numbers, page and server
(:mod:`minitf.study.inspection`). The commands stay at the top of the package: ``python -m minitf.trace``,
``minitf.gradcheck``, ``minitf.exercise``, ``minitf.inspect``."""
