"""The server's read-only web dashboard: sessions, participants, versions, the learning curve.

access decides who may look and over what; status_json turns the Status
RPC's reply into the page's JSON; web serves the page and that JSON on the
server's asyncio loop; static/ holds the page itself (hand-written HTML,
CSS and JavaScript: no build step, nothing fetched from elsewhere).
"""
