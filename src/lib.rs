//! harvester-cloud: cloud-config API and load balancers for guest clusters on Harvester.
#![forbid(unsafe_code)]

pub mod ipam;
