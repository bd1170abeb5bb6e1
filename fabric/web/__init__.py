"""The live view of a fabric in the browser.

``view`` (pure): the fabric graph as a drawing (one panel per plane, tiers, rails, stable ids),
frames (per link and direction: utilisation, ECN marks, drops, queue; failed links and switches;
the collective's progress; the controller's state), the picture as SVG, replay frames from a
results file. ``loads`` (pure): per-link loads of a flow-level model run over its steps, for
replay. ``server`` (side effects): the HTTP server, its Server-Sent Events stream and the
injection endpoints; ``live`` reads a running emulation.
"""
