"""The live control loop: snapshot from the store, scheduling cycle, one transaction of
decisions, executor actions after the commit, executor events back through the store's
one state mutator."""
