"""Planning: throughput, spot and checkpoint maths, and the search for the cheapest plan."""
