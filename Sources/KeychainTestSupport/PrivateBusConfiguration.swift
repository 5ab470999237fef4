/// The configuration of a test's own dbus-daemon: a session bus that listens only at `address`
/// (`unix:path=…`), activates only what `serviceDirectory` holds (nothing when nil, so an installed
/// provider such as gnome-keyring or an installed prompter can never answer in our place), lets every
/// peer own any name, send to any destination and receive every reply, and allows eavesdropping for
/// the tests that watch the bus for secrets. `maxMessageSize` raises the bus's bound on one message.
/// `standardServiceDirectories` activates from a session's own directories instead, as a desktop's
/// bus does (`XDG_DATA_HOME`, then `XDG_DATA_DIRS`, each `dbus-1/services`, in the bus's environment).
package func privateSessionBusConfiguration(listen address: String, serviceDirectory: String? = nil,
                                            standardServiceDirectories: Bool = false, maxMessageSize: Int? = nil) -> String {
    """
    <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
     "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
    <busconfig>
      <type>session</type>
      <listen>\(address)</listen>
      <auth>EXTERNAL</auth>
    \(serviceDirectory.map { "  <servicedir>\($0)</servicedir>\n" } ?? "")\
    \(standardServiceDirectories ? "  <standard_session_servicedirs/>\n" : "")\
      <policy context="default">
        <allow send_destination="*" eavesdrop="true"/>
        <allow receive_sender="*"/>
        <allow eavesdrop="true"/>
        <allow own="*"/>
      </policy>
    \(maxMessageSize.map { "  <limit name=\"max_message_size\">\($0)</limit>\n" } ?? "")\
    </busconfig>
    """
}
