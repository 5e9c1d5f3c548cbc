"""The ledger: the jobs table, its engine and named statements, enqueue, claim and every
status change (``queue``), and waking idle workers.
"""
