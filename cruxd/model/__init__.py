"""The domain model: pure dataclasses, no I/O. Import from the modules themselves: the
package imports nothing, so records that need one small type (control.records takes
view.TcpPortSet) do not pull numpy into an agent that never plans."""
