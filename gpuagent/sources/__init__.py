"""The sources of facts, one package per area; :class:`Source` is the seam each implements."""
