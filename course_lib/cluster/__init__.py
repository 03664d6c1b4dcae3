"""Tools the lessons use to run ranks and nodes on one machine: ``ranks`` (``start_ranks``: a pool of processes in
one process group, driven from notebook cells with ``%%px``; lessons 01, 03, 08) and ``multinode``
(``torchrun_nodes``: several torchrun agents on this host, each a "node", joined by a c10d or static rendezvous;
lesson 04). A training script never imports them."""
