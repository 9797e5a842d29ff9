/// Declare an exchange, creating it if it does not already exist.
///
/// Use the higher-level [`Channel::exchange_declare`] wrapper instead of
/// calling this method directly.
///
/// [`Channel::exchange_declare`]: crate::Channel::exchange_declare
