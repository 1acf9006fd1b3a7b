"""JobAssignment.note of an expired job, by how it left (cruxd/leader/status.py): the status of
a job that finished reads "ended", not "expired" (cruxd/cli/status_view.py). Apart from
records.py so that `cruxctl status` need not import the records to render them."""

ENDED_NOTE = "ended: the hosts that ran it no longer report it"
LOST_NOTE = "lost: every host that reported it went silent (it may still run)"
