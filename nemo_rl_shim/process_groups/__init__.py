"""Every process group torch holds: what each is, the value a group made later gets, and setting a timeout.

Owns:

* :mod:`.registry`: every group torch holds (``all_groups``, ``group_key``) and a run's own groups by mesh
  axis (``named_groups``, ``distinct_groups``), with their backends and timeouts as read (reads only);
* :mod:`.later`: the value a group made after set-up gets (the stand-in for torch's ``_get_default_timeout``:
  ``follow``, ``restore_torch_defaults``), which groups follow the phases (``followers``), and where a
  backend's timeout came from (``TimeoutSource``, ``group_sources``);
* :mod:`.setting`: the one setter every timeout change goes through (``set_group_timeout``,
  ``set_backend_timeouts``), the mesh's timeouts set and read back (``set_mesh_timeouts``).

May import: torch, :mod:`nemo_rl_shim.config`. Nothing here runs a collective. No name is re-exported here:
import from the module that owns it.
"""
