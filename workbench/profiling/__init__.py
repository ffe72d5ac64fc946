"""Measure a model (:mod:`.measure`), split any ``nn.Module`` (:mod:`.layering`), the Profile type
(:mod:`.table`) and the readers of other formats, registered here so that ``Profile.from_pipedream``
works whichever module was imported first."""

import workbench.profiling.pipedream  # noqa: F401  (registers the graph.txt reader with the Profile type)
