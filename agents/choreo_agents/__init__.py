"""choreo node agent: discovers and measures a node's GPU links and reports them."""
