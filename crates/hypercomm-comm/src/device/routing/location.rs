//! Where a buffer lives ([`Location`]) and which communicator of a process group runs a collective on it
//! ([`route`]): a pure decision, tested without a GPU.

/// Where a buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Location {
    /// CPU memory.
    Host,
    /// Memory of the CUDA device with this ordinal.
    Device(usize),
}

/// Which communicator runs a collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The host communicator.
    Host,
    /// The device communicator.
    Device,
}

/// Decides where a collective on a buffer at `location` runs, given the device of the group's device
/// communicator (`None` when the group has none). Pure; the error says what is wrong.
///
/// ```
/// use hypercomm_comm::device::{route, Location, Route};
///
/// assert_eq!(route(Location::Host, Some(0)), Ok(Route::Host));
/// assert_eq!(route(Location::Device(0), Some(0)), Ok(Route::Device));
/// assert!(route(Location::Device(1), Some(0)).is_err()); // wrong device
/// assert!(route(Location::Device(0), None).is_err()); // no device communicator
/// ```
pub fn route(location: Location, device: Option<usize>) -> Result<Route, String> {
    match (location, device) {
        (Location::Host, _) => Ok(Route::Host),
        (Location::Device(d), Some(mine)) if d == mine => Ok(Route::Device),
        (Location::Device(d), Some(mine)) => Err(format!(
            "buffer is on device {d} but the group's device communicator is on device {mine}"
        )),
        (Location::Device(d), None) => Err(format!(
            "buffer is on device {d} but the group has no device communicator (no gpu or no nccl when it was made)"
        )),
    }
}
