//! The cases `suite!` runs on both environments (see main.rs), one module per topic.

mod addresses;
mod dhcp;
mod lifecycle;
mod networks;
mod pool_options;
mod share_ip;
mod sharing;

pub use addresses::*;
pub use dhcp::*;
pub use lifecycle::*;
pub use networks::*;
pub use pool_options::*;
pub use share_ip::*;
pub use sharing::*;
