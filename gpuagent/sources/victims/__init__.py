"""Who a GPU fault hit: the processes its Xid names, those the driver tore down for it, and
those on the GPU at the time (:mod:`.rule`, pure; :mod:`.source`, the tick's)."""
